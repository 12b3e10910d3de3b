"""The budget check builds the model's token tables once per process (issue #17 item 4).

A frontend refuses a request whose shortest answer cannot fit in ``max_tokens``; for that it needs
the fewest tokens to an accepting state, not the constraint's [states, vocabulary] mask table, which
only the engine's processor fills rows from. And a frontend with an in-process engine shares one
vocabulary object (one token table, one native trie) with the engine's processor.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from llmserve.constraints import budget, compiled, compiler
from llmserve.constraints.budget import BudgetError
from llmserve.constraints.compiler import compile_constraint, shortest_answer
from llmserve.constraints.native import native, native_vocab
from llmserve.constraints.spec import spec_from_request
from llmserve.constraints.vocab import Vocab

SCHEMA = {
    "json_schema": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
}


def vocab() -> Vocab:
    rng = np.random.default_rng(3)
    letters = np.frombuffer(b'abcdefgh{}":,0123456789 ', dtype=np.uint8)
    tokens: list[bytes | None] = [bytes([b]) for b in range(256)]
    tokens += [bytes(rng.choice(letters, int(rng.integers(2, 5)))) for _ in range(3000)]
    tokens += [b'{"name":"', b'","n":', None]
    return Vocab(tokens, (len(tokens) - 1,), len(tokens))


def refuse(*args, **kwargs):
    raise AssertionError("a budget check compiled the constraint's mask tables")


@pytest.fixture(autouse=True)
def empty_memory():
    compiler._MEMORY.clear()
    yield
    compiler._MEMORY.clear()


def test_shortest_answer_compiles_no_mask_table_and_walks_no_state_it_need_not(monkeypatch, tmp_path):
    """The check searches forward from the start state of the automaton built as it is walked: no
    whole automaton, no mask table, no distance of every state (seconds for a large schema), and
    once per process."""
    v = vocab()
    searches = []
    searched = budget.lazy_fewest_tokens

    def counting(*args, **kwargs):
        searches.append(1)
        return searched(*args, **kwargs)

    monkeypatch.setattr(compiler, "lazy_fewest_tokens", counting)
    with monkeypatch.context() as m:
        m.setattr(compiler, "dfa_for", refuse)
        m.setattr(compiler, "fewest_tokens", refuse)
        m.setattr(compiler.CompiledConstraint, "lazy", refuse)
        m.setattr(compiler, "compile_dfa", refuse)
        m.setattr(native, "compile_masks", refuse)
        m.setattr(native, "Grammar", refuse)
        m.setattr(native, "token_distances", refuse)
        shortest = shortest_answer(SCHEMA, v, cache_dir=tmp_path)
        assert shortest_answer(SCHEMA, v, cache_dir=tmp_path) == shortest
    assert len(searches) == 1, "the search ran twice in one process"
    assert shortest.bound == "exact"
    # `{"name":"` and `","n":` are single tokens: `{"name":"","n":0}` takes at most 4 tokens
    assert 1 <= shortest.tokens <= 4
    form = compile_constraint(SCHEMA, v, cache_dir=tmp_path)  # the complete form, exact distances
    assert int(form.distances[form.start]) == shortest.tokens


def test_the_next_process_reads_the_distances_the_engine_computed(monkeypatch, tmp_path):
    """The engine computes every state's distance in the background (steering needs them) and keeps
    them on disk: another process (here: an emptied memory) compiling the same constraint takes them
    from there instead of walking the vocabulary again, and so does its budget check."""
    v = vocab()
    form = compile_constraint(SCHEMA, v, cache_dir=tmp_path)
    form.steering_distances()  # the first steered step: the single-byte bound, the exact ones later
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("dist-*.bin")):
        assert time.monotonic() < deadline, "the engine's distances never reached the disk cache"
        time.sleep(0.01)
    exact = form.known_distances
    assert exact is not None
    compiler._MEMORY.clear()
    monkeypatch.setattr(compiled, "token_distances", refuse)
    monkeypatch.setattr(compiler, "fewest_tokens", refuse)
    again = compile_constraint(SCHEMA, v, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.distances, exact)
    assert again.steering_distances() is again.distances  # no single-byte stand-in, no background walk
    compiler._MEMORY.clear()
    assert shortest_answer(SCHEMA, v, cache_dir=tmp_path) == (int(exact[again.start]), "exact")
    monkeypatch.undo()
    np.testing.assert_array_equal(exact, budget.token_distances(form.table, form.accept, v))


def test_shortest_answer_reads_a_form_the_process_already_holds(monkeypatch, tmp_path):
    v = vocab()
    form = compile_constraint(SCHEMA, v, cache_dir=tmp_path)
    _ = form.distances
    monkeypatch.setattr(compiler, "fewest_tokens", refuse)
    monkeypatch.setattr(compiler, "dfa_for", refuse)
    assert shortest_answer(SCHEMA, v, cache_dir=tmp_path) == (int(form.distances[form.start]), "exact")


def fooled_vocab() -> Vocab:
    """A vocabulary whose longest tokens lead the cut astray: ``{"nam`` first leaves ``e":"","n":0}``
    to single bytes (13 tokens in all), where ``{"n`` + ``ame":"","n":0}`` takes 2."""
    tokens: list[bytes | None] = [bytes([b]) for b in range(256)]
    tokens += [b'{"nam', b'{"n', b'ame":"","n":0}', None]
    return Vocab(tokens, (len(tokens) - 1,), len(tokens))


def test_a_tight_budget_has_the_engine_steer_by_the_tree_answer_or_by_exact_distances(monkeypatch, tmp_path):
    """Until the engine's background search has every state's distance, it steers by the single-byte
    figure; below that figure, along the tree's answer cut into the longest tokens, recorded (no
    distance computed anywhere). A budget below that answer too, which the exact search admits, has
    the check keep the exact distances, where the engine's form (here: another process, an emptied
    memory; and a form this process holds) takes them."""
    v = fooled_vocab()
    spec = compiler.spec_from_request(SCHEMA)
    dfa = compiler.dfa_for(spec, cache_dir=tmp_path)
    single_byte = int(budget.distances(dfa.table, dfa.accept, v.single_bytes)[dfa.start])
    exact = int(budget.token_distances(dfa.table, dfa.accept, v)[dfa.start])
    greedy = compiler._tree_greedy(spec, tmp_path, v)
    assert (exact, greedy, single_byte) == (2, 13, 17)
    compiler._MEMORY.clear()
    # roomy, then tight: the single-byte figure, then the tree's answer fits; nothing more is computed
    monkeypatch.setattr(compiler, "token_distances", refuse)
    assert shortest_answer(SCHEMA, v, cache_dir=tmp_path, within=single_byte).tokens <= single_byte
    assert shortest_answer(SCHEMA, v, cache_dir=tmp_path, within=greedy) == (greedy, "at most")
    assert not list(tmp_path.glob("dist-*.bin"))
    monkeypatch.undo()
    # tighter: the exact figure fits, the tree's answer does not
    assert shortest_answer(SCHEMA, v, cache_dir=tmp_path, within=exact) == (exact, "exact")
    assert list(tmp_path.glob("dist-*.bin"))
    compiler._MEMORY.clear()
    form = compile_constraint(SCHEMA, v, cache_dir=tmp_path)
    assert form.steering_distances() is form.distances
    assert int(form.steering_distances()[form.start]) == exact
    form.complete()  # its background completion would put it back in memory, in place of `held`
    # a form already held, steering by the bound, takes them at its next compile
    compiler._MEMORY.clear()
    for f in tmp_path.glob("dist-*.bin"):
        f.unlink()
    held = compile_constraint(SCHEMA, v, cache_dir=tmp_path)
    monkeypatch.setattr(compiled.CompiledConstraint, "_compute_exact", lambda self: None)
    assert int(held.steering_distances()[held.start]) == single_byte
    shortest_answer(SCHEMA, v, cache_dir=tmp_path, within=exact)
    assert compile_constraint(SCHEMA, v, cache_dir=tmp_path) is held
    assert int(held.steering_distances()[held.start]) == exact


def test_a_refusal_from_a_search_out_of_time_is_remembered(monkeypatch, tmp_path):
    v = vocab()
    searches = []

    def out_of_time(*args, **kwargs):
        searches.append(1)
        return budget.Shortest(7, "at least")

    monkeypatch.setattr(compiler, "fewest_tokens", out_of_time)
    monkeypatch.setattr(compiler, "lazy_fewest_tokens", out_of_time)
    for _ in range(3):  # the tree's answer (3 tokens) does not fit in 2; refused: even 7 tokens do not
        assert shortest_answer(SCHEMA, v, cache_dir=tmp_path, within=2) == (7, "at least")
    assert len(searches) == 1
    # the bound would admit: the tree's answer, read without a search, fits
    assert shortest_answer(SCHEMA, v, cache_dir=tmp_path, within=50).bound == "at most"
    assert len(searches) == 1


def test_a_remembered_lower_bound_is_searched_again_for_a_budget_it_might_fit(monkeypatch, tmp_path):
    v = vocab()
    obj = {"json_schema": {"type": "string", "minLength": 30}}
    greedy = compiler._tree_greedy(spec_from_request(obj), tmp_path, v)
    assert greedy is not None and greedy > 8
    searches = []

    def out_of_time(*args, **kwargs):
        searches.append(1)
        return budget.Shortest(7, "at least")

    monkeypatch.setattr(compiler, "lazy_fewest_tokens", out_of_time)
    for _ in range(2):  # refused: even 7 tokens do not fit in 5, remembered
        assert shortest_answer(obj, v, cache_dir=tmp_path, within=5) == (7, "at least")
    assert len(searches) == 1
    # 7 might fit in greedy - 1, and the tree's answer does not: searched again
    assert shortest_answer(obj, v, cache_dir=tmp_path, within=greedy - 1) == (7, "at least")
    assert len(searches) == 2


def test_native_token_distances_check_their_inputs():
    v = vocab()
    nv = native_vocab(v)
    table = np.full((2, 256), -1, np.int32)
    table[0, ord("a")] = 1
    accept = np.array([0, 1], np.uint8)
    dist = np.array([1, 0], np.int32)
    with pytest.raises(ValueError, match="order"):
        native.token_distances(nv, table, accept, dist, np.array([0, 5], np.int32))
    with pytest.raises(ValueError, match=r"\[S\]"):
        native.token_distances(nv, table, accept, dist[:1], np.array([1, 0], np.int32))
    native.token_distances(nv, table, accept, dist, np.array([1, 0], np.int32))
    assert dist.tolist() == [1, 0]
    for start in (-1, 2):
        with pytest.raises(ValueError, match="start state out of range"):
            native.fewest_tokens(nv, table, accept, start)
    assert native.fewest_tokens(nv, table, accept, 0) == (1, 0)
    for budget_ms in (10**13, 2**62):  # past what the clock can add: no limit, not an instant timeout
        assert native.fewest_tokens(nv, table, accept, 0, budget_ms=budget_ms) == (1, 0)


def test_frontend_and_in_process_engine_share_one_vocabulary(tiny_model_dir, monkeypatch):
    from vllm.engine.arg_utils import EngineArgs

    from llmserve.constraints import vllm_processor as vp

    config = EngineArgs(model=str(tiny_model_dir), dtype="float32", max_model_len=256).create_engine_config()
    loads = []
    load = vp._load_vocab

    def counting(mc):
        loads.append(1)
        return load(mc)

    monkeypatch.setattr(vp, "_load_vocab", counting)
    monkeypatch.setattr(vp, "_VOCABS", {})
    frontend = vp.vocab_for_model(config)  # what the server registers for validation
    processor = vp.ConstraintLogitsProcessor(config, torch.device("cpu"), False)
    assert processor.vocab is frontend
    assert len(loads) == 1, "the token table was built twice in one process"

    # the budget check in the frontend computes distances, never mask tables
    monkeypatch.setattr(vp, "_VALIDATION_VOCAB", [frontend])
    monkeypatch.setattr(vp.ConstraintLogitsProcessor, "instances", [])
    monkeypatch.setattr(compiler.CompiledConstraint, "lazy", refuse)
    monkeypatch.setattr(compiler, "compile_dfa", refuse)
    vp.check_budget({"regex": "[0-9]{4}"}, 50)
    with pytest.raises(BudgetError, match="needs"):
        vp.check_budget({"regex": "x{200}"}, 10)
