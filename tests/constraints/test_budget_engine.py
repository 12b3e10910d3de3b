"""Constrained answers that always complete (issue #17, item 3), on the real vLLM engine (CPU,
in-process) with the tiny random-weight model, which never closes anything by itself: at small
max_tokens every json_object and json_schema answer is valid JSON that validates and ends with
finish_reason "stop"; an impossible budget is refused before the engine runs it. One engine start,
in a child process (spawn-safe script budget_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from support.engine_scripts import run_engine_script
from transformers import AutoTokenizer

from llmserve.constraints import compiler
from llmserve.constraints.lazy_form import LazyConstraint
from llmserve.constraints.vocab import Vocab

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def budget_results(tiny_model_dir, tmp_path_factory):
    return run_engine_script(HERE / "budget_run.py", tiny_model_dir, tmp_path_factory.mktemp("budget") / "results.json")


def test_every_answer_is_complete_valid_json_within_max_tokens(budget_results):
    results = budget_results["results"]
    assert len(results) == 32
    for r in results:
        assert r["finish_reason"] == "stop", r
        assert r["tokens"] <= r["max_tokens"], r
        jsonschema.validate(json.loads(r["text"]), r["schema"])


def test_the_steering_did_the_closing(budget_results):
    # the random model reaches its budget on most requests: the processor narrowed rows near the end
    assert budget_results["stats"]["steered"] > 0
    assert any(r["tokens"] == r["max_tokens"] for r in budget_results["results"])


def test_an_impossible_budget_is_refused_with_the_tokens_needed(budget_results):
    refused = budget_results["refused"]
    assert refused is not None and "needs" in refused, refused
    assert "a budget of 5 tokens (the lesser of max_tokens" in refused, refused


def test_the_max_tokens_30_schema_case_is_steered_along_a_recorded_answer(budget_results, tiny_model_dir):
    """The json_schema case at max_tokens 30 (valid above) is below the single-byte figure: its
    shortest answer takes 42 bytes, 28 tokens cut into the longest, so the engine served it steered
    along that recorded answer, not by exact distances."""
    # the schema from the run's results: importing budget_run here would set the engine's environment in
    # this pytest process (it drops VLLM_CPU_KVCACHE_SPACE), and a later in-process engine start
    # (tests/serve_kserve) would then need 92% of the machine's memory free
    (schema,) = {json.dumps(r["schema"]) for r in budget_results["results"] if r["schema"] != {"type": "object"}}
    SCHEMA = json.loads(schema)

    vocab = Vocab.from_hf_tokenizer(AutoTokenizer.from_pretrained(tiny_model_dir))
    spec = compiler.spec_from_request({"json_schema": SCHEMA})
    answer = compiler._tree_answer(spec, False, vocab)
    greedy = compiler._tree_greedy(spec, False, vocab)
    assert answer is not None and greedy is not None and greedy <= 29 < len(answer)
    compiler._MEMORY.clear()
    form = compiler.serving_form(spec, vocab, cache_dir=False, within=29)
    assert isinstance(form, LazyConstraint) and form.steering_bound() <= 29
    compiler._BUILDER.drain(60)
    compiler._MEMORY.clear()
