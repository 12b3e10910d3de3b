"""Constraint kinds compiled against a real byte-level BPE tokenizer (the tiny model's), the disk
cache, request parsing and the processor's membership bookkeeping (without the engine)."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
from transformers import AutoTokenizer

from llmserve.constraints import (
    ByteAutomaton,
    ConstraintError,
    Vocab,
    automaton_to_dfa,
    compile_constraint,
    compile_regex,
    load_cached,
)
from llmserve.constraints.compiled import compile_dfa
from llmserve.constraints.spec import spec_from_request

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "enum": ["a", "b", "c"]},
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2},
        "sub": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 4}, "z": {"type": "null"}},
            "required": ["name"],
        },
    },
    "required": ["kind", "n", "tags"],
}


@pytest.fixture(scope="module")
def vocab(tiny_model_dir):
    return Vocab.from_hf_tokenizer(AutoTokenizer.from_pretrained(str(tiny_model_dir)))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def sample(compiled, rng, max_steps=400):
    """Random walk over allowed tokens until EOS; returns the token ids (EOS excluded)."""
    state, out = compiled.start, []
    for _ in range(max_steps):
        allowed = np.flatnonzero(compiled.allowed(state))
        tok = int(rng.choice(allowed))
        if tok in compiled.vocab.eos_ids:
            return out
        out.append(tok)
        state = compiled.native.step(state, tok)
        assert state >= 0
    raise AssertionError("no EOS reached")


def test_byte_level_vocab_round_trips(vocab, tokenizer):
    text = 'héllo wörld 😀 {"a": 1}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(vocab.tokens[i] for i in ids).decode() == text
    # some tokens carry a fragment of a multi-byte character
    assert any(t and not _utf8_ok(t) for t in vocab.tokens)
    assert vocab.eos_ids == (tokenizer.eos_token_id,)


def _utf8_ok(b):
    try:
        b.decode()
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize(
    "spec,check",
    [
        ({"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}, lambda s: re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", s)),
        ({"regex": r"(é|ü|😀){2,5}"}, lambda s: re.fullmatch(r"(é|ü|😀){2,5}", s)),
        ({"choice": ["yes", "no", "ünïcödé", "😀"]}, lambda s: s in ["yes", "no", "ünïcödé", "😀"]),
        ({"json_schema": SCHEMA}, lambda s: jsonschema.validate(json.loads(s), SCHEMA) is None),
    ],
)
def test_random_walks_satisfy_the_constraint(vocab, tokenizer, spec, check, tmp_path):
    compiled = compile_constraint(spec, vocab, cache_dir=tmp_path)
    rng = np.random.default_rng(0)
    for _ in range(25):
        ids = sample(compiled, rng)
        text = b"".join(vocab.tokens[i] for i in ids).decode("utf-8")
        assert check(text), text


def test_tokens_splitting_utf8_are_allowed_mid_character(vocab):
    compiled = compile_constraint({"regex": "😀+"}, vocab, cache_dir=False)
    emoji = "😀".encode()
    allowed = {i for i in np.flatnonzero(compiled.allowed(compiled.start))}
    prefixes = {i for i, t in enumerate(vocab.tokens) if t and emoji.startswith(t)}
    assert prefixes and prefixes <= allowed  # every token that is a prefix of the emoji bytes
    assert all(vocab.tokens[i] and (emoji * 4).startswith(vocab.tokens[i]) for i in allowed)


def test_disk_cache_hit_is_equal(vocab, tmp_path):
    spec = {"json_schema": SCHEMA}
    first = compile_constraint(spec, vocab, cache_dir=tmp_path).complete()  # the writer runs in the background
    files = list(tmp_path.glob("*.bin"))
    assert len(files) == 1 and files[0].stem == first.key
    assert not list(tmp_path.glob(".tmp-*"))
    again = load_cached(spec, vocab, tmp_path)
    assert again is not None  # a verified copy in memory (test_caches.py: why not a memory map)
    np.testing.assert_array_equal(again.masks, first.masks)
    np.testing.assert_array_equal(again.table, first.table)
    # another tokenizer (different digest) misses
    other = Vocab([*vocab.tokens[:-1], b"zz"], vocab.eos_ids, vocab.size)
    assert load_cached(spec, other, tmp_path) is None
    # a corrupt file is ignored and rebuilt
    files[0].write_bytes(b"garbage")
    rebuilt = compile_constraint(spec, Vocab(list(vocab.tokens), vocab.eos_ids, vocab.size), cache_dir=tmp_path)
    np.testing.assert_array_equal(rebuilt.masks, first.masks)


@pytest.mark.parametrize(
    "bad",
    [
        {"regex": "([a-z"},
        {"regex": "(?=x)"},
        {"regex": r"\1"},
        {"choice": []},
        {"choice": "abc"},
        {"json_schema": {"type": "array", "contains": {"type": "integer"}, "unevaluatedItems": False}},
        {"json_schema": {"not": {"maximum": 3}}},
        {"json_schema": "{not json"},
        {"json_schema": {"type": "array", "uniqueItems": True, "minItems": 2}},
        {"json_schema": {"$dynamicRef": "#meta"}},
        {"regex": "a", "choice": ["a"]},
        {"grammar": "x"},
        "[1, 2]",
    ],
)
def test_invalid_constraints_raise_constraint_error(bad):
    with pytest.raises(ConstraintError):
        spec_from_request(bad).to_dfa()
    assert issubclass(ConstraintError, ValueError)  # vLLM maps ValueError from validate_params to HTTP 400


def test_custom_byte_automaton_compiles_to_the_native_path(vocab):
    class Digits(ByteAutomaton):
        def start(self):
            return 0

        def step(self, state, byte):
            return min(state + 1, 3) if 0x30 <= byte <= 0x39 and state < 3 else None

        def accepting(self, state):
            return state == 3

    dfa = automaton_to_dfa(Digits())
    assert dfa.matches(b"123") and not dfa.matches(b"12") and not dfa.matches(b"1234")
    c = compile_dfa(dfa, vocab)
    rng = np.random.default_rng(1)
    for _ in range(10):
        ids = sample(c, rng)
        assert re.fullmatch(r"[0-9]{3}", b"".join(vocab.tokens[i] for i in ids).decode())


def test_compile_is_lazy_and_completes_to_the_eager_masks(vocab, tokenizer):
    spec = spec_from_request({"json_schema": SCHEMA})
    lazy = compile_constraint(spec, vocab, cache_dir=False)
    assert lazy.native.ready_rows == 2  # the start state's row and the dead row
    eager = compile_dfa(spec.to_dfa(), vocab)
    # a row computed on demand equals the eager one, before anything else is computed
    state = lazy.native.walk(lazy.start, tokenizer.encode('{"kind":"a","n":1', add_special_tokens=False))
    assert state >= 0
    np.testing.assert_array_equal(lazy.allowed(state), eager.allowed(state))
    assert lazy.native.ready_rows == 3
    np.testing.assert_array_equal(lazy.masks, eager.masks)  # .masks waits for every row
    assert lazy.native.ready_rows == lazy.num_states + 1


def test_batch_fill_computes_missing_rows(vocab, tokenizer):
    from llmserve.constraints.native import native, native_vocab

    spec = spec_from_request({"regex": "[a-z]{2,8}@[a-z]+[.](com|org)"})
    lazy = compile_constraint(spec, vocab, cache_dir=False)
    eager = compile_dfa(spec.to_dfa(), vocab)
    histories = [tokenizer.encode(p, add_special_tokens=False) for p in ("", "ab", "abc@", "abc@xy.", "abc@xy.co")]
    batch = native.Batch(native_vocab(vocab))
    for i, h in enumerate(histories):
        batch.set_row(i, lazy.native, list(h))
    batch.sync(len(histories))
    out = np.zeros((len(histories), vocab.words), np.uint32)
    batch.fill(out)
    for i, h in enumerate(histories):
        state = eager.walk(h)
        assert state >= 0
        np.testing.assert_array_equal(out[i], eager.masks[state])


def test_fills_racing_the_background_finisher_see_complete_rows(vocab, tokenizer, tmp_path):
    """Batch fills compute rows on the pool while the finisher thread compresses the same
    constraint's rows (computing those not ready into its own scratch row): every fill sees its row
    whole, and the form completed after is the same."""
    from llmserve.constraints.compiler import _MEMORY
    from llmserve.constraints.native import native, native_vocab

    spec = spec_from_request({"json_schema": SCHEMA})
    eager = compile_dfa(spec.to_dfa(), vocab)
    text = '{"kind":"b","n":-12,"x":3.5,"ok":true,"tags":["ab","c"],"sub":{"name":"zé","z":null}}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    histories = [ids[:k] for k in range(len(ids) + 1)]
    batch = native.Batch(native_vocab(vocab))
    out = np.zeros((len(histories), vocab.words), np.uint32)
    for attempt in range(5):
        _MEMORY.clear()
        lazy = compile_constraint(spec, vocab, cache_dir=tmp_path / str(attempt))  # the finisher starts
        for i, h in enumerate(histories):
            batch.set_row(i, lazy.native, list(h))
        batch.sync(len(histories))
        batch.fill(out)
        for i, h in enumerate(histories):
            np.testing.assert_array_equal(out[i], eager.masks[eager.walk(h)])
        lazy.complete()
        np.testing.assert_array_equal(lazy.masks, eager.masks)
        assert (tmp_path / str(attempt) / f"{lazy.key}.bin").exists()


def test_unwritable_cache_does_not_fail_compilation(vocab, tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("x")  # the cache folder cannot be created (chmod would not stop root)
    c = compile_constraint({"regex": "[0-9]+"}, vocab, cache_dir=blocked).complete()
    assert c.allowed(c.start).any()
    assert blocked.read_text() == "x"


@pytest.mark.parametrize(
    "pattern,message",
    [
        ("(a|b)*a(a|b){16}", "more than 65536 automaton states"),  # 2^17 subsets
        ("(?:(?:a{1000}){1000})", "more than 2000000 automaton states"),  # the NFA alone
        (r"[\ud800-\udfff]", "matches no string at all"),  # surrogates only: not characters
    ],
)
def test_oversized_constraints_are_refused_before_they_cost_much(pattern, message):
    with pytest.raises(ConstraintError, match=message):
        compile_regex(pattern)


def test_regex_dfa_is_minimal_for_simple_patterns():
    assert compile_regex("a*").num_states == 1
    assert compile_regex("(a|b)(a|b)").num_states == 3


def test_request_forms(monkeypatch):
    from vllm import SamplingParams

    from llmserve.constraints.vllm_processor import ConstraintLogitsProcessor, request_constraint

    assert request_constraint(None) is None
    assert request_constraint({"other": 1}) is None
    assert request_constraint({"constraint": '{"regex": "a+"}'}) == {"regex": "a+"}
    assert request_constraint({"constraint_choice": ["a", "b"]}) == {"choice": ["a", "b"]}
    assert request_constraint({"constraint_json_schema": json.dumps(SCHEMA)}) == {"json_schema": json.dumps(SCHEMA)}
    with pytest.raises(ConstraintError):
        request_constraint({"constraint": "{", "constraint_regex": "a"})
    ConstraintLogitsProcessor.validate_params(SamplingParams(extra_args={"constraint_regex": "[a-z]+"}))
    with pytest.raises(ValueError):
        ConstraintLogitsProcessor.validate_params(SamplingParams(extra_args={"constraint_regex": "[a-z"}))
    with pytest.raises(ValueError):
        ConstraintLogitsProcessor.validate_params(SamplingParams(extra_args={"constraint": {"machine": "nope"}}))
