"""The constraint processor on the real vLLM engine (CPU, in-process), under preemption, chunked
prefill and batch moves. One engine start, in a child process (spawn-safe script engine_run.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
from support.engine_scripts import run_engine_script

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


@pytest.fixture(scope="module")
def engine_results(tiny_model_dir, tmp_path_factory):
    return run_engine_script(HERE / "engine_run.py", tiny_model_dir, tmp_path_factory.mktemp("engine") / "results.json")


def check(constraint, text, token_ids):
    if "regex" in constraint:
        assert re.fullmatch(constraint["regex"], text), text
    elif "choice" in constraint:
        assert text in constraint["choice"]
    elif "json_schema" in constraint:
        jsonschema.validate(json.loads(text), constraint["json_schema"])
    elif constraint["machine"] == "even_ab":
        assert re.fullmatch(r"(?:[ab][ab]){1,10}", text), text
    elif constraint["machine"] == "five_tokens":
        body = [t for t in token_ids if t in constraint["args"]["allowed"]]
        assert len(body) == 5 and token_ids[:5] == body, token_ids


def test_every_constrained_output_is_valid(engine_results):
    constrained = [r for r in engine_results["results"] if r["constraint"] is not None]
    assert len(constrained) >= 36
    for r in constrained:
        assert r["finish_reason"] == "stop", r
        check(r["constraint"], r["text"], r["token_ids"])


def test_batch_changes_were_forced(engine_results):
    stats = engine_results["stats"]
    assert stats["readded"] >= 1, stats  # preempted requests came back with output tokens
    assert stats["moved"] + stats["swapped"] >= 1, stats  # the batch was condensed under the processor
    assert stats["removed"] >= 1, stats


def test_unconstrained_rows_untouched(engine_results):
    free = [r for r in engine_results["results"] if r["constraint"] is None]
    assert free and all(r["finish_reason"] == "length" for r in free)


def test_invalid_constraint_rejected_before_the_engine(engine_results):
    assert engine_results["rejected"] and "regex" in engine_results["rejected"]


def test_every_prefill_was_chunked(engine_results):
    # max_num_batched_tokens=32 in engine_run.py: longer prompts are prefilled in several steps
    assert min(r["prompt_tokens"] for r in engine_results["results"]) > 32
