"""The guarded engine-process fix for seeded sampling on CPU (llmserve/serve/vllm_patches.py), without an engine.

The fix itself runs against the real engine in test_engine_survives.py; here: the guard refuses code
it was not written against, and the patched methods on vLLM's real CPUModelRunner class rewind a
real CPU generator by state and keep it away from the offset rewind that raises.
"""

from __future__ import annotations

import inspect
import types

import numpy as np
import pytest
import torch

from llmserve.serve import vllm_patches
from llmserve.serve.vllm_patches import VllmPatchError


def _sources() -> tuple[str, str]:
    return vllm_patches._source(vllm_patches.RUNNER_MODULE), vllm_patches._source(vllm_patches.CPU_RUNNER_MODULE)


def test_the_installed_vllm_is_the_code_the_patch_expects():
    assert vllm_patches.source_problems(vllm_patches._vllm_version(), *_sources()) == []
    assert vllm_patches.check_before_engine()  # CPU here: the patch is announced


def test_another_vllm_version_or_changed_code_is_refused_loudly():
    runner, cpu_runner = _sources()
    assert "vLLM 0.33.0" in vllm_patches.source_problems("0.33.0", runner, cpu_runner)[0]
    fixed_upstream = runner.replace(vllm_patches.OFFSET_REWIND, "rewind(gen)")
    assert any("no longer contains" in p for p in vllm_patches.source_problems("0.32.0", fixed_upstream, cpu_runner))
    overridden = cpu_runner + "\n    def _sample(self):\n        pass\n"
    assert any("defines _sample itself" in p for p in vllm_patches.source_problems("0.32.0", runner, overridden))


def test_apply_refuses_a_module_without_the_runner():
    with pytest.raises(VllmPatchError, match="has no CPUModelRunner"):
        vllm_patches._apply(types.ModuleType(vllm_patches.CPU_RUNNER_MODULE))


def _runner(generators: dict[int, torch.Generator], discard: list[bool]):
    batch = types.SimpleNamespace(num_reqs=len(discard), generators=generators)
    return types.SimpleNamespace(input_batch=batch, discard_request_mask=types.SimpleNamespace(np=np.array(discard)))


def test_patched_methods_rewind_discarded_rows_by_state_and_skip_the_offset_rewind():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def draw(runner, *args, **kwargs):  # what the sampler does with each seeded row's generator
        return [torch.empty(8).exponential_(generator=g) for g in runner.input_batch.generators.values()]

    def offset_rewind(runner, *args, **kwargs):  # the loop of GPUModelRunner._bookkeeping_sync
        for i in np.nonzero(runner.discard_request_mask.np[: runner.input_batch.num_reqs])[0]:
            gen = runner.input_batch.generators.get(int(i))
            if gen is not None:
                gen.set_offset(gen.get_offset() - 4)
        return "booked"

    assert vllm_patches.OFFSET_REWIND in inspect.getsource(GPUModelRunner._bookkeeping_sync)
    partial, done = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    runner = _runner({0: partial, 1: done}, [True, False])
    with pytest.raises(RuntimeError, match="does not use offset"):  # vLLM's rewind on a CPU generator
        offset_rewind(runner)

    methods = vllm_patches._patched_methods(draw, offset_rewind)
    before = partial.get_state()
    methods["_sample"](runner)
    assert torch.equal(partial.get_state(), before)  # the discarded draw left no trace
    assert not torch.equal(done.get_state(), before)  # a real draw advanced its generator
    assert methods["_bookkeeping_sync"](runner) == "booked"
    assert runner.input_batch.generators == {0: partial, 1: done}  # both back in the batch
    # the first real draw is the one an unsplit prompt makes
    assert torch.equal(
        torch.empty(8).exponential_(generator=partial),
        torch.empty(8).exponential_(generator=torch.Generator().manual_seed(3)),
    )
