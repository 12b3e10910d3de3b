"""`llmserve serve --engine triton`: packages hosted by a real Triton Inference Server, under llmserve's supervision.

Startup steps (each logged with its duration, as on the embedded engine):
  1. environment  engine/cache settings the models inherit (the vLLM backend reads them in Triton's stub)
  2. package      open every package (verify, unpack into the local cache); refuse code-loading engine arguments
                  unless --trust-remote-code; all packages share one executionMode
  3. metrics-dir  wipe and set PROMETHEUS_MULTIPROC_DIR (vLLM inside Triton writes its metrics there)
  4. triton       start `tritonserver` on the packages' model repositories in explicit model-control mode, loading
                  exactly their models; ready when every model is READY (a model that fails to load: its name,
                  Triton's reason and log lines, exit 7)
  5. ready        supervised: Triton exiting, or a model leaving READY, ends llmserve with exit 7 (a supervisor
                  restarts it); SIGTERM/SIGINT stop Triton (in-flight requests drain) and leave no process behind.

executionMode standalone: Triton serves KServe v2 itself on the public ports (--port HTTP, --grpc-port gRPC,
--metrics-port metrics). executionMode embedded puts llmserve's own frontends in front of a Triton on loopback;
that path is not built yet and is refused with the way out (executionMode: standalone, or --engine vllm).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmserve.errors import ExitCode, InvalidInputError
from llmserve.serve.options import ServeOptions
from llmserve.serve.triton.backend_settings import (
    ENV_CONSTRAINTS,
    ENV_ENGINE_OVERRIDES,
    ENV_MAX_N,
    ENV_MAX_PROMPT_CHARS,
    ENV_TRUST_REMOTE_CODE,
)

log = logging.getLogger("llmserve.serve")

ENGINES = ("vllm", "triton")
# How often a ready Triton is checked: its process, then its models' readiness (an HTTP call per model).
SUPERVISE_INTERVAL_S = 1.0
# Loading an LLM in Triton builds the engine (weights, KV cache): minutes on a loaded CPU host.
READY_TIMEOUT_S = 600.0


class EngineChoiceError(InvalidInputError):
    """The engine asked for cannot serve the packages given."""

    code = "serve-engine"


def choose_engine(requested: str | None, backends: Sequence[str]) -> str:
    """The engine for packages of these backends: --engine if given (and able), else vLLM for one vLLM package,
    Triton otherwise (a Python-backend model runs only in Triton's Python backend)."""
    if requested is not None and requested not in ENGINES:
        raise EngineChoiceError(f"--engine {requested}: unknown engine; choose one of {', '.join(ENGINES)}")
    if requested == "vllm":
        if "python" in backends:
            raise EngineChoiceError(
                "a Python-backend package (custom execute()) runs only in Triton's Python backend, "
                "not on the embedded vLLM engine",
                hint="Serve it with --engine triton (make triton-env builds the Triton environment).",
            )
        if len(backends) > 1:
            raise EngineChoiceError(
                f"the embedded vLLM engine serves one package; {len(backends)} were given",
                hint="Host several packages in one Triton: --engine triton.",
            )
        return "vllm"
    if requested == "triton":
        return "triton"
    return "vllm" if list(backends) == ["vllm"] else "triton"


def execution_mode(modes: dict[str, str]) -> str:
    """The one executionMode of the packages hosted together (model id -> mode)."""
    distinct = sorted(set(modes.values()))
    if len(distinct) != 1:
        raise InvalidInputError(
            "packages hosted in one Triton must share their executionMode; got "
            + ", ".join(f"{m}: {mode}" for m, mode in sorted(modes.items())),
            hint="Set the same `executionMode:` in each llmserve.yaml and package them again.",
        )
    return distinct[0]


def backend_environment(options: ServeOptions) -> dict[str, str]:
    """What llmserve's vLLM backend inside Triton reads (llmserve.serve.triton.vllm_model): the server's limits."""
    overrides = {k: v for k, v in options.engine_overrides().items() if k != "logits_processors"}
    return {
        ENV_MAX_PROMPT_CHARS: str(options.max_prompt_chars),
        ENV_MAX_N: str(options.max_n),
        ENV_CONSTRAINTS: "1" if options.constraints else "0",
        ENV_TRUST_REMOTE_CODE: "1" if options.trust_remote_code else "0",
        ENV_ENGINE_OVERRIDES: json.dumps(overrides),
    }


@dataclass
class _Stop:
    event: asyncio.Event
    signalled: bool = False


async def serve_on_triton(options: ServeOptions, on_ready: Callable[[list[str]], None] | None = None) -> int:
    # deferred, as in llmserve.serve.server: these import llmserve.packaging (about a second)
    import os

    from llmserve.packaging.opened import open_package
    from llmserve.serve.engine import merged_engine_args, require_trust
    from llmserve.serve.environment import prepare_engine_environment, prepare_metrics_dir
    from llmserve.serve.server import StepLog
    from llmserve.serve.triton.locate import locate_tritonserver
    from llmserve.serve.triton.server import TritonPorts, TritonServer, free_ports

    stop = _Stop(asyncio.Event())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.event.set)
    steps = StepLog()
    triton: TritonServer | None = None
    try:
        with steps.step("environment", "engine and cache settings"):
            prepare_engine_environment(options.kv_cache_gib)
        with steps.step("package", ", ".join(str(p) for p in options.packages)):
            packages = [open_package(Path(p)) for p in options.packages]
            for package in packages:
                manifest = package.manifest
                log.info("startup: package     %s v%s (%s)", manifest.modelId, manifest.modelVersion, package.root)
                if manifest.backend == "vllm":
                    merged = merged_engine_args(manifest.engine, options.engine_overrides())
                    require_trust(merged, trusted=options.trust_remote_code, source=str(package.root))
            ids = [p.manifest.modelId for p in packages]
            if len(set(ids)) != len(ids):
                raise InvalidInputError(f"two packages have the same modelId: {', '.join(ids)}")
            mode = execution_mode({p.manifest.modelId: p.manifest.executionMode for p in packages})
            if mode == "embedded":
                raise InvalidInputError(
                    "executionMode embedded on Triton (llmserve's OpenAI and KServe frontends in front of a "
                    "Triton on loopback) is not available yet",
                    hint="Set `executionMode: standalone` in llmserve.yaml (Triton serves KServe v2 itself on "
                    "--port/--grpc-port), or serve a vLLM package on the embedded engine: --engine vllm.",
                )
            if options.openai:
                raise InvalidInputError(
                    "--openai with --engine triton is not available yet: in executionMode standalone Triton "
                    "serves KServe v2 HTTP/gRPC only",
                    hint="Drop --openai (clients use KServe v2: tritonclient), or serve on --engine vllm.",
                )
        with steps.step("metrics-dir", "wipe and set PROMETHEUS_MULTIPROC_DIR"):
            folder = prepare_metrics_dir(options.metrics_dir, options.port)
            log.info("startup: metrics-dir %s", folder)
        with steps.step("triton", f"start tritonserver with {', '.join(ids)}"):
            install = locate_tritonserver()
            log.info("startup: triton      %s (found by %s)", install.binary, install.found_by)
            wanted = [options.port, options.grpc_port, options.metrics_port]
            spare = iter(free_ports(options.host, wanted.count(0)))
            ports = TritonPorts(*[p or next(spare) for p in wanted])
            environ = {**os.environ, **backend_environment(options)}
            triton = TritonServer(
                [p.repository_dir or p.root for p in packages],
                ids,
                install=install,
                host=options.host,
                ports=ports,
                ready_timeout=READY_TIMEOUT_S,
                stop_timeout=options.drain_timeout_s,
                environ=environ,
            )
            start = asyncio.ensure_future(asyncio.to_thread(triton.start))
            await asyncio.wait({start, asyncio.ensure_future(stop.event.wait())}, return_when=asyncio.FIRST_COMPLETED)
            if not start.done():  # a signal during the start: stop what is starting, then leave
                await asyncio.to_thread(triton.stop)
                await asyncio.gather(start, return_exceptions=True)
                return 0
            start.result()
        addresses = [f"KServe v2 HTTP {triton.http_url}", f"gRPC {triton.grpc_url}", f"metrics {triton.metrics_url}"]
        total = sum(s for _, s in steps.steps)
        log.info("ready in %.2f s: Triton hosts %s; %s", total, ", ".join(ids), ", ".join(addresses))
        if on_ready:
            on_ready(addresses)
        died = await _supervise(triton, stop.event)
        if died:
            log.error(
                "triton: %s; exiting with exit code %d so that a supervisor restarts the server",
                died,
                ExitCode.ENGINE,
            )
            return ExitCode.ENGINE
        log.info("shutdown: signal received; stopping Triton (in-flight requests get %.0f s)", options.drain_timeout_s)
        return 0
    finally:
        if triton is not None:
            await asyncio.to_thread(triton.stop)
            log.info("shutdown: done")
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _supervise(triton: Any, stop: asyncio.Event) -> str | None:
    """Wait for a signal (None) or for Triton to stop serving (why)."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), SUPERVISE_INTERVAL_S)
            return None
        except TimeoutError:
            pass
        code = triton.exit_code()
        if code is not None:
            return f"tritonserver exited with code {code} (its log: {triton.log_path})"
        for model in triton.models:
            if not await asyncio.to_thread(triton.is_model_ready, model) and triton.exit_code() is None:
                return f"model '{model}' is no longer ready in Triton (its log: {triton.log_path})"
    return None
