"""The torch apply path: what the processor uses for logits that are not CPU float32 (bf16/fp16, and
any accelerator device). On this machine it runs on CPU tensors; the code is device-agnostic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmserve.constraints import reference
from llmserve.constraints.vllm_processor import apply_bitmask_torch


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 200),
    st.integers(0, 2),
    st.sampled_from(["float32", "bfloat16", "float16"]),
    st.integers(0, 2**31),
)
def test_torch_apply_equals_reference(B, V, extra_words, dtype, seed):
    rng = np.random.default_rng(seed)
    W = (V + 31) // 32 + extra_words  # a bitmask wider than the logits is fine
    bitmask = rng.integers(0, 2**32, size=(B, W), dtype=np.uint32)
    bitmask[0] = 0  # a row with nothing allowed
    active = rng.integers(0, 2, size=B).astype(bool)
    logits32 = rng.standard_normal((B, V)).astype(np.float32)
    expected = logits32.copy()
    reference.apply_bitmask(expected, bitmask, active)

    logits = torch.from_numpy(logits32.copy()).to(getattr(torch, dtype))
    apply_bitmask_torch(logits, torch.from_numpy(bitmask.view(np.uint8)), torch.from_numpy(active))
    got = logits.float().numpy()
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
    kept = ~np.isneginf(expected)
    np.testing.assert_array_equal(got[kept], torch.from_numpy(logits32).to(getattr(torch, dtype)).float().numpy()[kept])


def test_torch_apply_refuses_a_mask_of_the_wrong_shape_or_type():
    logits = torch.zeros(2, 100)
    with pytest.raises(ValueError, match="uint8"):
        apply_bitmask_torch(logits, torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match=">= 13"):
        apply_bitmask_torch(logits, torch.zeros(2, 12, dtype=torch.uint8))


@pytest.fixture(scope="module")
def processor_and_width(tiny_model_dir):
    from vllm.engine.arg_utils import EngineArgs

    from llmserve.constraints.vllm_processor import ConstraintLogitsProcessor

    config = EngineArgs(model=str(tiny_model_dir), dtype="float32", max_model_len=256).create_engine_config()
    return ConstraintLogitsProcessor(config, torch.device("cpu"), False), config.model_config.get_vocab_size()


def test_processor_masks_bf16_logits_as_it_masks_float32(processor_and_width, tiny_model_dir):
    """The same batch through the native float32 path and through the torch path (bf16)."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    processor, V = processor_and_width
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    constrained = SamplingParams(extra_args={"constraint_regex": "[0-9]{4}-[0-9]{2}"})
    histories = [[], tok.encode("20", add_special_tokens=False), tok.encode("2024-1", add_special_tokens=False)]
    added = [(i, constrained, [1, 2], h) for i, h in enumerate(histories)] + [(3, SamplingParams(), [1], [])]
    processor.update_state(BatchUpdate(batch_size=4, removed=[], added=added, moved=[]))
    base = torch.randn(4, V)
    f32 = processor.apply(base.clone())
    b16 = processor.apply(base.clone().to(torch.bfloat16))
    assert torch.equal(torch.isneginf(f32), torch.isneginf(b16.float()))
    assert not torch.isneginf(f32[3]).any()  # the unconstrained row is untouched
    digits = {i for i in range(V) if i < len(tok) and tok.decode([i]).isdigit()}
    allowed0 = set(torch.nonzero(~torch.isneginf(f32[0])).flatten().tolist())
    assert allowed0 and allowed0 <= digits  # only digit tokens can start "dddd-dd"


def test_steered_rows_are_masked_alike_on_the_native_and_torch_paths(processor_and_width, tiny_model_dir):
    """Rows near their max_tokens get a budget row on top of their mask: applied natively for CPU
    float32 logits, with torch otherwise; both leave the same tokens."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    processor, V = processor_and_width
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    history = tok.encode("2024-1", add_special_tokens=False)
    near = SamplingParams(max_tokens=len(history) + 3, extra_args={"constraint_regex": "[0-9]{4}-[0-9]{2}"})
    far = SamplingParams(max_tokens=200, extra_args={"constraint_regex": "[0-9]{4}-[0-9]{2}"})
    processor.update_state(
        BatchUpdate(
            batch_size=2, removed=[], added=[(0, near, [1], list(history)), (1, far, [1], list(history))], moved=[]
        )
    )
    before = processor.stats["steered"]
    base = torch.randn(2, V)
    f32 = processor.apply(base.clone())
    b16 = processor.apply(base.clone().to(torch.bfloat16))
    assert processor.stats["steered"] == before + 2  # row 0 on both calls, row 1 never
    assert torch.equal(torch.isneginf(f32), torch.isneginf(b16.float()))
    # the far row keeps every token its mask allows; the near one only those that still end in time
    assert torch.isneginf(f32[0]).sum() >= torch.isneginf(f32[1]).sum()
    compiled = processor.constrained[0]
    state, _ = processor.batch.row(0)
    left = near.max_tokens - len(history)
    assert compiled.budget_row(state, left - 2) is compiled.budget_row(state, left - 2)  # kept, not walked again
