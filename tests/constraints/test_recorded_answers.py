"""Steering along a recorded answer (``add_answer``, ``budget.steerable_from``): where a request's
budget is below the single-byte figure but one shortest answer cut into the longest tokens fits, both
forms (the automaton built as it is walked and the complete one) steer by the least of the two
figures, and every steered walk still ends accepted within the budget, whatever tokens it takes."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import regexes
from support.strategies import vocabs as shared_vocabs

from llmserve.constraints import compiler, regex
from llmserve.constraints.budget import UNREACHABLE
from llmserve.constraints.compiled import CompiledConstraint, compile_dfa
from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.lazy_form import LazyConstraint
from llmserve.constraints.native import native_vocab
from llmserve.constraints.vocab import Vocab

ALPHABET = ["a", "b", "é", "€", '"', "0", "{", "}", ":", ","]
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def forms(pattern: str, vocab: Vocab) -> tuple[LazyConstraint, CompiledConstraint] | None:
    """(lazy form, complete form) of ``pattern``, the complete one steering by the single-byte figure
    (its background search for the exact distances not started); None when the whole automaton is
    over a limit."""
    try:
        whole = regex.compile_regex(pattern)
    except ConstraintError:
        return None
    complete = compile_dfa(whole, vocab)
    complete._compute_exact = lambda: None  # type: ignore[method-assign]
    return LazyConstraint(vocab, regex.lazy_ast(regex.parse(pattern))), complete


def allowed_in(row: np.ndarray, vocab: Vocab) -> list[int]:
    return [int(t) for t in np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.size])]


def mask_row(form, state: int) -> np.ndarray:
    if isinstance(form, LazyConstraint):
        out = np.empty(form.vocab.words, dtype=np.uint32)
        form.lazy.mask_row(native_vocab(form.vocab), state, out)
        return out
    return form.mask_row(state)


def steered_walk(form, vocab: Vocab, budget: int, choose) -> list[int]:
    """An answer of at most ``budget`` tokens before end of sequence, steered as the processor steers
    a row (``_steer``): left to the constraint's mask while more tokens are left than the form's
    largest figure, then each token drawn by ``choose`` from the budget row of what is left."""
    state, out = form.start, []
    while True:
        k = budget - len(out) - 1  # the processor's `left - 2`, max_tokens = budget + 1
        row = mask_row(form, state) if k >= form.max_distance else form.budget_row(state, k)
        assert row is not None, f"stranded after {out} with {budget - len(out)} tokens left"
        token = int(choose(allowed_in(row, vocab)))
        if token in vocab.eos_ids:
            assert form.is_accepting(state)
            return out
        out.append(token)
        state = form.step(state, token)
        assert state >= 0 and len(out) <= budget


@SETTINGS
@given(regexes(ALPHABET, ("(?:ab){0}",), max_leaves=8), shared_vocabs(ALPHABET, "some"), st.data())
def test_a_walk_steered_along_a_recorded_answer_ends_accepted_within_its_budget(pattern, vocab, data):
    built = forms(pattern, vocab)
    if built is None:
        return
    choose = lambda allowed: data.draw(st.sampled_from(allowed))  # noqa: E731
    for form in built:
        answer = form.shortest_from(form.start)
        if answer is None:  # an empty language has no answer
            assert form.steering_bound() == UNREACHABLE
            return
        tokens = form.add_answer(answer)
        if tokens < 0:  # a byte of it starts no token: nothing recorded, nothing steered by it
            continue
        assert form.steering_bound() <= tokens
        assert form.max_distance >= form.steering_bound()
        budget = data.draw(st.integers(form.steering_bound(), form.steering_bound() + 3))
        assert len(steered_walk(form, vocab, budget, choose)) <= budget


@SETTINGS
@given(regexes(ALPHABET, ("(?:ab){0}",), max_leaves=8), shared_vocabs(ALPHABET, "some"), st.data())
def test_an_answer_recorded_from_a_later_state_keeps_the_figures_consistent(pattern, vocab, data):
    """Answers recorded from states along a walk (a request back from preemption records from the
    state its output reached): wherever a state's figure is finite, a token of its budget row at
    one less leads on, or the state accepts."""
    built = forms(pattern, vocab)
    if built is None:
        return
    lazy, complete = built
    for form in (lazy, complete):
        state, seen = form.start, []
        for _ in range(6):
            answer = form.shortest_from(state)
            if answer is not None:
                form.add_answer(answer, state)
            seen.append(state)
            row = form.budget_row(state, UNREACHABLE - 1)
            if row is None:
                break
            moves = [t for t in allowed_in(row, vocab) if t not in vocab.eos_ids]
            if not moves:
                break
            state = form.step(state, data.draw(st.sampled_from(moves)))
        for q in seen:
            d = form.steering_bound(q)
            if d == UNREACHABLE or form.is_accepting(q):
                continue
            row = form.budget_row(q, d - 1)
            assert row is not None and any(t not in vocab.eos_ids for t in allowed_in(row, vocab))


def test_an_answer_that_is_not_one_records_nothing():
    vocab = Vocab([bytes([b]) for b in range(256)] + [b"ab", None], (257,), 258)
    lazy, complete = forms("abc", vocab)
    for form in (lazy, complete):
        before = form.steering_bound()
        assert form.add_answer(b"ab") == -1  # not accepted at its end
        assert form.add_answer(b"abd") == -1  # leaves the automaton
        assert form.steering_bound() == before == 3
        assert form.add_answer(b"abc") == 2  # "ab" + "c"
        assert form.steering_bound() == 2
        assert form.steering_bound(form.step(form.start, 256)) == 1


@SETTINGS
@given(regexes(ALPHABET, ("(?:ab){0}",), max_leaves=8), shared_vocabs(ALPHABET, "some"))
def test_both_forms_find_answers_alike(pattern, vocab):
    """The answer a form records is found the same way over either automaton: over bytes that are
    tokens by themselves where those reach acceptance, else over any bytes, so a check that read it
    off one automaton and an engine holding the other record answers of the same tokens."""
    built = forms(pattern, vocab)
    if built is None:
        return
    lazy, complete = built
    a, b = lazy.shortest_from(0), complete.shortest_from(complete.start)
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert len(a) == len(b)
    nv = native_vocab(vocab)
    assert (nv.longest_cut(a) >= 0) == (nv.longest_cut(b) >= 0)


def test_a_vocabulary_without_some_single_bytes_is_steered_at_every_step():
    """``x`` is no token by itself: the state after ``y`` cannot end in single bytes, so no figure
    covers it; a row left to the mask while more tokens are left than the largest finite figure
    would walk into it and run out (``yyyyyyyy``). Every step is steered instead."""
    tokens: list[bytes | None] = [bytes([b]) for b in range(256) if b != ord("x")] + [b"xa", None]
    vocab = Vocab(tokens, (len(tokens) - 1,), len(tokens))
    y = tokens.index(b"y")
    lazy, complete = forms("xa|y+xaxaxa", vocab)
    for form in (lazy, complete):
        assert form.add_answer(b"xa") == 1
        assert form.max_distance >= UNREACHABLE - 1
        out = steered_walk(form, vocab, 7, lambda allowed: y if y in allowed else allowed[0])
        assert out == [tokens.index(b"xa")]


SCHEMA = {
    "json_schema": {
        "type": "object",
        "properties": {f"property_{i:02d}": {"type": "integer"} for i in range(12)},
        "required": [f"property_{i:02d}" for i in range(12)],
    }
}


def named_vocab() -> Vocab:
    """Single bytes, and the property names as tokens: the shortest answer takes 12 x 17 bytes but
    about 3 x 12 tokens."""
    tokens: list[bytes | None] = [bytes([b]) for b in range(256)]
    tokens += [f'"property_{i:02d}":'.encode() for i in range(12)] + [b',"', b"{", None]
    return Vocab(tokens, (len(tokens) - 1,), len(tokens))


@pytest.fixture(autouse=True)
def fresh():
    compiler._MEMORY.clear()
    yield
    compiler._BUILDER.drain(60)
    compiler._MEMORY.clear()


def test_a_tight_budget_is_admitted_and_served_without_any_whole_automaton(monkeypatch, tmp_path):
    """The request's budget is below the single-byte figure and above the tree's answer cut into
    tokens: the check admits it without an automaton or distances, and the engine's form records
    that answer and steers every walk to end within the budget; a budget below that answer is
    served from the complete form, by exact distances."""
    v = named_vocab()
    spec = compiler.spec_from_request(SCHEMA)
    greedy = compiler._tree_greedy(spec, tmp_path, v)
    answer = compiler._tree_answer(spec, tmp_path, v)
    assert greedy is not None and answer is not None and greedy < len(answer)

    def refuse(*args, **kwargs):
        raise AssertionError("the tight budget cost a whole automaton or every state's distance")

    monkeypatch.setattr(compiler, "dfa_for", refuse)
    monkeypatch.setattr(compiler, "token_distances", refuse)
    monkeypatch.setattr(compiler._BUILDER, "submit", lambda job: True)  # the engine's complete form: not yet
    found = compiler.shortest_answer(SCHEMA, v, cache_dir=tmp_path, within=greedy)
    assert found == (greedy, "at most")
    assert not list(tmp_path.glob("dist-*.bin"))
    compiler._MEMORY.clear()  # the engine: another process
    form = compiler.serving_form(SCHEMA, v, cache_dir=tmp_path, within=greedy)
    assert isinstance(form, LazyConstraint)
    assert form.steering_bound() <= greedy < form.lazy.byte_distance(0, v.single_bytes.view(np.uint8))
    rng = np.random.default_rng(3)
    for _ in range(20):
        out = steered_walk(form, v, greedy, lambda allowed: rng.choice(allowed))
        assert len(out) <= greedy
    monkeypatch.undo()
    compiler._MEMORY.clear()
    # `,"` then `property_01":` in single bytes: the cut takes more than the fewest (`,` + `"property_01":`)
    assert compiler.shortest_answer(SCHEMA, v, cache_dir=tmp_path, within=greedy - 1) == (37, "exact")
    assert list(tmp_path.glob("dist-*.bin")), "the check did not keep every state's distance for the engine"
    compiler._MEMORY.clear()
    tighter = compiler.serving_form(SCHEMA, v, cache_dir=tmp_path, within=greedy - 1)
    assert not isinstance(tighter, LazyConstraint)
    assert tighter.known_distances is not None and tighter.steering_distances() is tighter.known_distances
    out = steered_walk(tighter, v, 37, lambda allowed: rng.choice(allowed))
    assert len(out) == 37


def test_the_engine_never_computes_every_distance_inline(monkeypatch, tmp_path, caplog):
    """A budget below the recorded answer with no exact distances kept (no check shared the disk
    cache): the engine starts its background search and steers by the figures it has, logged,
    instead of stalling the batch for the search."""
    v = named_vocab()
    spec = compiler.spec_from_request(SCHEMA)
    greedy = compiler._tree_greedy(spec, tmp_path, v)
    assert greedy is not None
    started = []
    monkeypatch.setattr(compiler, "token_distances", lambda *a, **kw: pytest.fail("computed inline"))
    monkeypatch.setattr(CompiledConstraint, "_compute_exact", lambda self: started.append(self))
    with caplog.at_level(logging.INFO, logger="llmserve.constraints.compiler"):
        form = compiler.serving_form(SCHEMA, v, cache_dir=tmp_path, within=greedy - 1)
    assert isinstance(form, CompiledConstraint) and form.known_distances is None
    assert started == [form]
    assert "steered by an upper bound until its exact distances" in caplog.text


def test_a_complete_form_steers_a_tight_budget_along_the_tree_answer(tmp_path):
    """A complete form already held, steering by the single-byte figure until its exact distances
    exist: a tight budget records the tree's answer in it instead of waiting for them."""
    v = named_vocab()
    spec = compiler.spec_from_request(SCHEMA)
    greedy = compiler._tree_greedy(spec, tmp_path, v)
    assert greedy is not None
    held = compiler.compile_constraint(SCHEMA, v, cache_dir=tmp_path)
    held._compute_exact = lambda: None  # type: ignore[method-assign]  # the background search: not yet
    assert held.steering_bound() > greedy
    assert compiler.serving_form(SCHEMA, v, cache_dir=tmp_path, within=greedy) is held
    assert held.known_distances is None and held.steering_bound() <= greedy
    rng = np.random.default_rng(4)
    for _ in range(20):
        assert len(steered_walk(held, v, greedy, lambda allowed: rng.choice(allowed))) <= greedy


def test_the_engines_tree_answer_out_of_time_is_not_remembered_as_a_refusal(monkeypatch):
    """The engine reads the tree's answer to steer by (``_steers``); that walk running out of time
    on a loaded engine (its CPU spent) is no answer to steer by this time, and is not remembered as
    a check's refusal would be: the next request's ``_steers`` walks the tree again."""
    v = named_vocab()
    spec = compiler.spec_from_request(SCHEMA)
    form = compiler.serving_form(SCHEMA, v, cache_dir=False)
    assert isinstance(form, LazyConstraint)
    walks = []

    def out_of_time(*args, **kwargs):
        walks.append(1)
        raise ConstraintError("constraint compile time budget (2000 ms) exceeded")

    cpu = iter(range(0, 10**6, 100))  # 100 s of CPU per reading: the budget spent, not starved
    monkeypatch.setattr(compiler, "tree_facts", out_of_time)
    monkeypatch.setattr(compiler.time, "thread_time", lambda: next(cpu))
    for _ in range(2):
        assert not compiler._steers(form, spec, False, 20, None)
    assert len(walks) == 2
