"""What the engine's processor serves a row from (``compiler.serving_form``, ``lazy_form.py``): a new
constraint is served from its automaton built as it is walked, with the very masks its complete
form gives, while the complete form is built in the background for later requests; the frontend's
check converts it once and builds no whole automaton; what the lazy path cannot take (nesting past
MAX_DEPTH, a tight budget) is served whole, as before."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from llmserve.constraints import compiler
from llmserve.constraints.budget import distances as byte_distances
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.finisher import FINISHER
from llmserve.constraints.lazy_form import LazyConstraint
from llmserve.constraints.limits import Limits, set_limits
from llmserve.constraints.native import native, native_vocab
from llmserve.constraints.spec import spec_from_request
from llmserve.constraints.vocab import Vocab

SCHEMA = {
    "json_schema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "maxItems": 3},
            "n": {"type": "integer"},
        },
        "required": ["name"],
    }
}


def vocab() -> Vocab:
    rng = np.random.default_rng(5)
    letters = np.frombuffer(b'abnmexyz{}[]":,0123456789 ', dtype=np.uint8)
    tokens: list[bytes | None] = [bytes([b]) for b in range(256)]
    tokens += [bytes(rng.choice(letters, int(rng.integers(2, 6)))) for _ in range(2000)]
    tokens += [b'{"name":"', b'","tags":[', b'"],"n":', None]
    return Vocab(tokens, (len(tokens) - 1,), len(tokens))


GATES: list[threading.Event] = []


def hold_builder() -> threading.Event:
    """Keep the background builder busy until the event is set (at the latest when the test ends)."""
    gate = threading.Event()
    GATES.append(gate)
    compiler._BUILDER.submit(gate.wait)
    return gate


@pytest.fixture(autouse=True)
def fresh():
    compiler._MEMORY.clear()
    yield
    for gate in GATES:
        gate.set()
    GATES.clear()
    compiler._BUILDER.drain(60)
    FINISHER.wait_all(60)
    set_limits(None)
    compiler._MEMORY.clear()


def fills(grammar, v: Vocab, tokens: list[int]) -> np.ndarray:
    """The mask a batch row over ``grammar`` gets after ``tokens``."""
    batch = native.Batch(native_vocab(v))
    batch.set_row(0, grammar, list(tokens))
    out = np.zeros((1, v.words), np.uint32)
    batch.sync(1)
    batch.fill(out, np.zeros(1, np.uint8), 1)
    return out[0]


def walk_both(lazy: LazyConstraint, whole, v: Vocab, steps: int, seed: int) -> int:
    """Random tokens both forms allow, comparing the batch's mask at each step; the steps walked."""
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    for step in range(steps):
        row = fills(lazy.native, v, tokens)
        np.testing.assert_array_equal(row, fills(whole.native, v, tokens))
        allowed = [int(t) for t in np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[: v.size])]
        allowed = [t for t in allowed if t not in v.eos_ids]
        if not allowed:
            return step
        tokens.append(int(rng.choice(allowed)))
    return steps


def test_a_new_constraint_is_served_lazily_then_from_its_complete_form(tmp_path):
    v = vocab()
    gate = hold_builder()
    form = compiler.serving_form(SCHEMA, v, cache_dir=tmp_path)
    assert isinstance(form, LazyConstraint)
    assert form.lazy.found <= 8, "more than the first mask's states were built on the request path"
    assert compiler.serving_form(SCHEMA, v, cache_dir=tmp_path) is form  # shared until the complete one
    whole = compiler.compile_constraint(SCHEMA, v, cache_dir=False)
    for seed in range(4):
        assert walk_both(form, whole, v, 30, seed) > 3
    gate.set()
    assert compiler._BUILDER.drain(60)
    later = compiler.serving_form(SCHEMA, v, cache_dir=tmp_path)
    assert not isinstance(later, LazyConstraint), "the complete form was not built in the background"
    assert later.num_states == whole.num_states
    later.complete()
    assert list(tmp_path.glob("[0-9a-f]*.bin")), "the complete form was not cached"
    key = compiler.cache_key(spec_from_request(SCHEMA), v)
    assert compiler._MEMORY.get(("lazy-form", key, id(v))) is None, "the superseded lazy form is still counted"


def test_steering_rows_of_the_lazy_form_keep_the_answer_finishable():
    """The lazy form steers by the single-byte figure, read off its NFA: the tokens of a budget row
    all lead to states that can still end within k tokens, and they are the whole automaton's
    budget row under that figure, state for state."""
    v = vocab()
    form = compiler.serving_form(SCHEMA, v, cache_dir=False)
    assert isinstance(form, LazyConstraint)
    whole = compiler.compile_constraint(SCHEMA, v, cache_dir=False)
    table, classes = whole._search_form()
    bound = byte_distances(table, whole.accept, v.single_bytes, classes)
    assert form.steering_bound() == bound[whole.start]
    assert form.max_distance >= int(bound[bound < 2**31 - 1].max())
    rng = np.random.default_rng(1)
    tokens: list[int] = []
    for _ in range(12):
        state, full = form.walk(tokens), whole.walk(tokens)
        for k in (0, 1, 3, 8):
            got = form.budget_row(state, k)
            want = np.zeros(v.words, np.uint32)
            whole.native.budget_row(full, bound, k, want)
            np.testing.assert_array_equal(got if got is not None else np.zeros(v.words, np.uint32), want)
        row = form.budget_row(state, 4)
        if row is None:
            break
        allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[: v.size])
        allowed = [int(t) for t in allowed if t not in v.eos_ids]
        if not allowed:
            break
        tokens.append(int(rng.choice(allowed)))


def test_a_tight_budget_is_steered_along_the_tree_answer_and_a_tighter_one_by_exact_distances():
    """Where the single-byte figure cannot end the answer within the request's budget, the lazy form
    records the tree's answer cut into the longest tokens (3: ``{"name":"`` ``"`` ``}``) and steers
    by it; below that too (but not below the fewest tokens, 2: the check admitted it) the lazy form
    would steer too late: the complete form steers by exact distances."""
    v = vocab()
    hold_builder()
    form = compiler.serving_form(SCHEMA, v, cache_dir=False)
    assert isinstance(form, LazyConstraint)
    figure = form.steering_bound()
    assert figure == 11
    assert compiler.serving_form(SCHEMA, v, cache_dir=False, within=figure) is form
    assert compiler.serving_form(SCHEMA, v, cache_dir=False, within=3) is form
    assert form.steering_bound() == 3 and form.max_distance >= figure
    assert compiler.shortest_answer(SCHEMA, v, cache_dir=False, within=2) == (2, "exact")  # kept every distance
    tighter = compiler.serving_form(SCHEMA, v, cache_dir=False, within=2)
    assert not isinstance(tighter, LazyConstraint)
    assert tighter.known_distances is not None and int(tighter.known_distances[tighter.start]) == 2


def test_the_check_converts_once_and_builds_no_whole_automaton(monkeypatch, tmp_path):
    converted = []
    real = compiler.schema_words
    monkeypatch.setattr(compiler, "schema_words", lambda *a, **kw: converted.append(1) or real(*a, **kw))
    monkeypatch.setattr(compiler, "dfa_for", lambda *a, **kw: pytest.fail("the check built the whole automaton"))
    spec = spec_from_request(SCHEMA)
    compiler.check_constraint(spec, cache_dir=tmp_path)
    compiler.check_constraint(spec, cache_dir=tmp_path)
    assert len(converted) == 1
    assert list(tmp_path.glob("words-dfa-*.bin")), "the converted tree was not kept for the engine"
    compiler._MEMORY.clear()  # another process: the tree is read back, not converted again
    assert isinstance(compiler.serving_form(SCHEMA, vocab(), cache_dir=tmp_path), LazyConstraint)
    assert len(converted) == 1


def test_an_invalid_constraint_is_refused_by_the_check_and_remembered(monkeypatch):
    spec = spec_from_request({"json_schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}})
    converted = []
    real = compiler.schema_words
    monkeypatch.setattr(compiler, "schema_words", lambda *a, **kw: converted.append(1) or real(*a, **kw))
    for _ in range(3):
        with pytest.raises(ConstraintError, match="nonsense"):
            compiler.check_constraint(spec, cache_dir=False)
    assert len(converted) == 1


def test_nesting_past_the_lazy_paths_depth_is_served_whole_from_its_narrower_subset():
    """Recursion unrolled past MAX_DEPTH: the lazy path has no narrower subset, the whole one has."""
    inner: dict = {"$ref": "#/$defs/n"}
    for _ in range(11):
        inner = {"type": "object", "properties": {"a": inner}}
    obj = {"json_schema": {"$defs": {"n": inner}, "$ref": "#/$defs/n"}}
    spec = spec_from_request(obj)
    assert compiler.words_for(spec, cache_dir=False) is None
    compiler.check_constraint(spec, cache_dir=False)  # refused by the lazy path, taken by dfa_for
    form = compiler.serving_form(obj, vocab(), cache_dir=False)
    assert not isinstance(form, LazyConstraint)


def test_a_whole_automaton_over_the_state_limit_stays_lazy_and_serves_in_full(caplog):
    """The lazy path builds only the states answers reach: a constraint whose whole automaton is over
    the limit is served in full instead of refused (the whole path refuses it)."""
    set_limits(Limits(max_states=200))
    obj = {"regex": "[ab]*a[ab]{9}"}  # 2^10 states whole
    v = vocab()
    with pytest.raises(ConstraintError, match="more than 200 automaton states"):
        compiler.dfa_for(spec_from_request(obj), cache_dir=False)
    compiler._MEMORY.clear()
    compiler.check_constraint(spec_from_request(obj), cache_dir=False)
    form = compiler.serving_form(obj, v, cache_dir=False)
    assert isinstance(form, LazyConstraint)
    with caplog.at_level(logging.INFO, logger="llmserve.constraints.compiler"):
        assert compiler._BUILDER.drain(60)
    assert "whole automaton is not built" in caplog.text
    assert isinstance(compiler.serving_form(obj, v, cache_dir=False), LazyConstraint)
    a, b = v.tokens.index(b"a"), v.tokens.index(b"b")
    answer = [a] + [b] * 9
    state = form.walk(answer)
    assert state >= 0 and form.is_accepting(state)


def test_new_answers_get_a_new_automaton_once_one_is_at_its_state_limit():
    """The states of a lazy form are shared by every answer served from it: once its automaton is at
    the state limit, answers on it end where they reach a state it could not build, and the next
    request gets an automaton of its own instead of inheriting that."""
    set_limits(Limits(max_states=10))  # 80 states built as walked (SUBSET_FACTOR)
    obj = {"regex": "[ab]*a[ab]{9}"}
    v = vocab()
    form = compiler.serving_form(obj, v, cache_dir=False)
    assert isinstance(form, LazyConstraint)
    with pytest.raises(ValueError, match="more than 80 automaton states"):
        for n in range(1, 4096):  # every a/b string up to 11 letters: 2^10 states whole
            form.lazy.walk(format(n, "b").translate(str.maketrans("01", "ab")).encode())
    assert form.lazy.exhausted
    again = compiler.serving_form(obj, v, cache_dir=False)
    assert isinstance(again, LazyConstraint) and again is not form and again.lazy is not form.lazy
    assert not again.lazy.exhausted
    a, b = v.tokens.index(b"a"), v.tokens.index(b"b")
    state = again.walk([b, b, a] + [a, b] * 4 + [b])
    assert state >= 0 and again.is_accepting(state)


def test_a_complete_form_over_the_limits_leaves_a_tight_budget_steered_lazily(caplog):
    """The complete form a tight budget asks for may be refused where the lazy one serves (here:
    over the state limit): the row is served, steered as far as the single-byte figure allows,
    instead of an error inside the engine's batch update."""
    set_limits(Limits(max_states=200))
    obj = {"regex": "[ab]*a[ab]{9}"}
    v = vocab()
    compiler.check_constraint(spec_from_request(obj), cache_dir=False)
    hold_builder()
    with caplog.at_level(logging.WARNING, logger="llmserve.constraints.compiler"):
        form = compiler.serving_form(obj, v, cache_dir=False, within=1)  # 10 bytes, in 2 tokens at best
    assert isinstance(form, LazyConstraint)
    assert "may not end the answer within max_tokens" in caplog.text


def test_a_request_back_from_preemption_is_gated_on_the_state_its_output_reached():
    """Steerable from the start is not enough for a request coming back with output: the state its
    tokens reached must be steerable within what is left."""
    v = vocab()
    hold_builder()
    form = compiler.serving_form(SCHEMA, v, cache_dir=False)
    assert isinstance(form, LazyConstraint)
    output = [v.tokens.index(bytes([b])) for b in b'{"name":"abc']  # 12 tokens for 12 bytes
    assert form.steering_bound(form.walk(output)) == 2  # `"}` to go
    # the start's figure (11) fits 1 + 12 tokens: the state the output reached decides
    assert compiler.serving_form(SCHEMA, v, cache_dir=False, within=2, tokens=output) is form
    whole = compiler.serving_form(SCHEMA, v, cache_dir=False, within=1, tokens=output)
    assert not isinstance(whole, LazyConstraint)


def test_a_budget_check_past_the_automatons_limits_is_the_constraints_error():
    set_limits(Limits(max_states=4))
    with pytest.raises(ConstraintError, match="automaton states"):
        compiler.shortest_answer({"regex": "[ab]*a[ab]{9}"}, vocab(), cache_dir=False)


def test_a_lazy_row_out_of_time_retires_its_automaton_for_new_answers():
    """A row that runs out of its time ends the answers on it (the grammar's dead row, for good):
    the next request gets a new automaton, whose rows are timed afresh."""
    set_limits(Limits(compile_ms=30))  # its NFA takes about a millisecond, the row after x 100 ms or more
    obj = {"regex": "x((a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p)?){300}y"}
    v = vocab()
    form = compiler.serving_form(obj, v, cache_dir=False)
    assert isinstance(form, LazyConstraint)
    row = np.zeros(v.words, np.uint32)
    with pytest.raises(ValueError, match="time budget"):
        form.lazy.mask_row(native_vocab(v), form.lazy.walk(b"x"), row)
    assert form.lazy.exhausted
    again = compiler.serving_form(obj, v, cache_dir=False)
    assert isinstance(again, LazyConstraint) and again.lazy is not form.lazy and not again.lazy.exhausted


def test_a_constraint_whose_whole_automaton_is_over_the_time_budget_is_checked_whole_from_then_on(
    monkeypatch, tmp_path
):
    """The check admitted it (conversion and NFA fit); its whole automaton then ran out of the time
    budget, CPU spent, and the lazy one would cost it as much row by row: later checks, in this
    process and in another one sharing the disk cache, take the whole path (a JSON schema's narrower
    subset, or a refusal), as the check did before the lazy path. A request admitted already is
    served, whatever the whole path says."""
    set_limits(Limits(compile_ms=40))

    def over_time(*args, **kwargs):
        until = time.thread_time() + 0.03
        while time.thread_time() < until:
            pass
        raise ConstraintError("constraint compile time budget (40 ms) exceeded")

    monkeypatch.setattr(compiler, "compile_words", over_time)
    v = vocab()
    spec = spec_from_request(SCHEMA)
    compiler.check_constraint(spec, cache_dir=tmp_path)
    form = compiler.serving_form(SCHEMA, v, cache_dir=tmp_path)
    assert isinstance(form, LazyConstraint)
    assert compiler._BUILDER.drain(60)
    whole_checks = []
    real_dfa_for = compiler.dfa_for
    monkeypatch.setattr(compiler, "dfa_for", lambda *a, **kw: whole_checks.append(1) or real_dfa_for(*a, **kw))
    compiler.check_constraint(spec, cache_dir=tmp_path)  # this process
    compiler._MEMORY.clear()
    compiler.check_constraint(spec, cache_dir=tmp_path)  # another one
    assert len(whole_checks) == 2
    assert not isinstance(compiler.serving_form(SCHEMA, v, cache_dir=tmp_path), LazyConstraint)
    # where the whole path refuses, the check refuses; a request admitted before is served
    FINISHER.wait_all(60)
    for complete in tmp_path.glob("[0-9a-f]*.bin"):  # the complete form just cached: not this case
        complete.unlink()
    compiler._MEMORY.clear()
    monkeypatch.setattr(compiler, "dfa_for", lambda *a, **kw: over_time())
    with pytest.raises(ConstraintError, match="time budget"):
        compiler.check_constraint(spec, cache_dir=tmp_path)
    monkeypatch.setattr(compiler, "compile_constraint", lambda *a, **kw: over_time())
    assert isinstance(compiler.serving_form(SCHEMA, v, cache_dir=tmp_path), LazyConstraint)
    assert form.walk([v.tokens.index(b'{"name":"')]) >= 0


def test_a_check_out_of_time_is_remembered_when_it_used_the_cpu(monkeypatch):
    set_limits(Limits(compile_ms=40))
    calls = []

    def over_time(*args, **kwargs):
        calls.append(1)
        until = time.thread_time() + 0.03
        while time.thread_time() < until:
            pass
        raise ConstraintError("constraint compile time budget (40 ms) exceeded")

    monkeypatch.setattr(compiler, "schema_words", over_time)
    spec = spec_from_request(SCHEMA)
    for _ in range(3):
        with pytest.raises(ConstraintError, match="time budget"):
            compiler.check_constraint(spec, cache_dir=False)
    assert len(calls) == 1


def test_a_build_dropped_from_a_full_queue_is_queued_again_by_the_next_request(monkeypatch):
    v = vocab()
    queued = []
    real = compiler._BUILDER.submit

    def full_once(call, **kw):
        if getattr(call, "func", None) is not compiler._build_complete:  # the test's own drain
            return real(call, **kw)
        queued.append(call)
        return len(queued) > 1 and real(call, **kw)

    monkeypatch.setattr(compiler._BUILDER, "submit", full_once)
    form = compiler.serving_form(SCHEMA, v, cache_dir=False)
    assert isinstance(form, LazyConstraint) and len(queued) == 1  # dropped: a full queue
    assert compiler.serving_form(SCHEMA, v, cache_dir=False) is form and len(queued) == 2
    assert compiler._BUILDER.drain(60)
    assert not isinstance(compiler.serving_form(SCHEMA, v, cache_dir=False), LazyConstraint)
    assert len(queued) == 2  # queued once it was taken


def test_the_queued_build_does_not_depend_on_the_form_that_queued_it():
    """The form that queued the complete form's build may be gone by the time the builder reaches it
    (its requests done and the cache's entry evicted, or renewed past its automaton's limits): the
    build still happens, for the requests after."""
    v = vocab()
    gate = hold_builder()
    form = compiler.serving_form(SCHEMA, v, cache_dir=False)
    assert isinstance(form, LazyConstraint)
    compiler._MEMORY.discard(("lazy-form", form.key, id(v)))
    del form
    gate.set()
    assert compiler._BUILDER.drain(60)
    assert not isinstance(compiler.serving_form(SCHEMA, v, cache_dir=False), LazyConstraint)
