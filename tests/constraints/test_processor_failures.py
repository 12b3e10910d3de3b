"""A constraint the frontend admitted but the engine cannot build must end that request's answer,
not the engine: an exception out of ``update_state`` stops vLLM's engine core and fails every
request in the batch."""

from __future__ import annotations

import logging

import pytest
import torch

from llmserve.constraints import vllm_processor
from llmserve.constraints.errors import ConstraintError


@pytest.fixture(scope="module")
def config(tiny_model_dir):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(tiny_model_dir), dtype="float32", max_model_len=256).create_engine_config()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_row_whose_constraint_fails_in_the_engine_ends_and_the_others_are_served(
    config, tiny_model_dir, monkeypatch, caplog, backend
):
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    monkeypatch.setenv("LLMSERVE_CONSTRAINT_BACKEND", backend)
    processor = vllm_processor.ConstraintLogitsProcessor(config, torch.device("cpu"), False)
    real_compile = processor._compile

    def failing(obj, within, tokens):
        if obj.get("regex") == "b+":
            raise ConstraintError("the constraint's conversion ran out of its time budget (2000 ms)")
        return real_compile(obj, within, tokens)

    monkeypatch.setattr(processor, "_compile", failing)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    V = config.model_config.get_vocab_size()
    fine = SamplingParams(max_tokens=50, extra_args={"constraint_regex": "[0-9]{4}"})
    doomed = SamplingParams(max_tokens=50, extra_args={"constraint_regex": "b+"})
    resumed = SamplingParams(max_tokens=50, extra_args={"constraint_regex": "b+"})  # preempted with output
    added = [(0, fine, [1], []), (1, doomed, [1], []), (2, resumed, [1], tok.encode("bbb", add_special_tokens=False))]
    with caplog.at_level(logging.ERROR, logger=vllm_processor.__name__):
        processor.update_state(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
    assert processor.stats["failed"] == 2
    assert sum("could not be built in the engine" in r.getMessage() for r in caplog.records) == 2
    assert "time budget" in caplog.records[0].getMessage()

    logits = processor.apply(torch.randn(3, V))
    eos = set(processor.vocab.eos_ids)
    for row in (1, 2):
        assert set(torch.nonzero(~torch.isneginf(logits[row])).flatten().tolist()) == eos
    allowed0 = set(torch.nonzero(~torch.isneginf(logits[0])).flatten().tolist())
    assert allowed0 and not allowed0 & eos  # the admitted row is served as before: digits only
    assert all(tok.decode([t]).isdigit() for t in allowed0 if t < len(tok))


def test_a_custom_machine_that_fails_in_the_engine_ends_its_row(config, monkeypatch, caplog):
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    processor = vllm_processor.ConstraintLogitsProcessor(config, torch.device("cpu"), False)

    def broken(name, vocab, args):
        raise RuntimeError(f"machine {name} lost its table")

    monkeypatch.setattr(vllm_processor, "make_machine", broken)
    params = SamplingParams(max_tokens=10, extra_args={"constraint": {"machine": "whatever", "args": {}}})
    with caplog.at_level(logging.ERROR, logger=vllm_processor.__name__):
        processor.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params, [1], [])], moved=[]))
    assert processor.stats["failed"] == 1
    assert "RuntimeError: machine whatever lost its table" in caplog.text
    logits = processor.apply(torch.randn(1, config.model_config.get_vocab_size()))
    assert set(torch.nonzero(~torch.isneginf(logits[0])).flatten().tolist()) == set(processor.vocab.eos_ids)


def test_ending_a_row_never_raises_itself(config, monkeypatch, caplog):
    """An empty refusal, and a request object JSON cannot write (mixed-type keys, in process), are
    logged as they can be; a failure that is not a refusal is logged with its traceback."""
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    processor = vllm_processor.ConstraintLogitsProcessor(config, torch.device("cpu"), False)
    failures = iter([ConstraintError(""), KeyError("table")])

    def failing(obj, within, tokens):
        raise next(failures)

    monkeypatch.setattr(processor, "_compile", failing)
    odd = {"constraint": {"machine": "whatever", "args": {"table": {1: "a", "b": 2}}}}
    added = [
        (0, SamplingParams(max_tokens=10, extra_args=odd), [1], []),
        (1, SamplingParams(max_tokens=10, extra_args=odd), [1], []),
    ]
    with caplog.at_level(logging.ERROR, logger=vllm_processor.__name__):
        processor.update_state(BatchUpdate(batch_size=2, removed=[], added=added, moved=[]))
    assert processor.stats["failed"] == 2
    assert [bool(r.exc_info) for r in caplog.records] == [False, True]
    logits = processor.apply(torch.randn(2, config.model_config.get_vocab_size()))
    for row in (0, 1):
        assert set(torch.nonzero(~torch.isneginf(logits[row])).flatten().tolist()) == set(processor.vocab.eos_ids)
