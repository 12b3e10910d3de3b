"""Issue #17 item 4: a lazily compiled form is completed in the background compressed, row by row
(csrc/grammar.cpp, ``Grammar::compact_all``): rows requests computed are read, the others computed
into a scratch row, so completing a form never holds its dense table. Constraints whose dense table
was over ``complete_max_mb`` used to stay lazy and uncached (3 of 40 corpus schemas, 292-729 MiB
dense at cl100k_base); now only a form whose *compressed* rows pass it does. The compressed arrays
must be exactly what compressing the dense table gives."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_compressed_rows import DELTA, bench_constraints, json_vocab, wide_vocab  # noqa: F401 (fixtures)
from test_equivalence import SETTINGS, regexes, vocabs

from llmserve.constraints import Vocab, compile_constraint, load_cached
from llmserve.constraints import compiler as compiler_mod
from llmserve.constraints import finisher as finisher_mod
from llmserve.constraints.comb import Comb
from llmserve.constraints.compiled import CompiledConstraint, compile_dfa
from llmserve.constraints.limits import Limits, set_limits
from llmserve.constraints.native import require_native
from llmserve.constraints.regex import compile_regex

require_native()


def assert_same_compressed(streamed, whole: CompiledConstraint) -> None:
    """``streamed`` (a core Grammar from compact_all) holds exactly ``whole``'s compressed rows and
    the same automaton."""
    assert streamed.compressed_rows is not None and whole.compressed_rows is not None
    for a, b in zip(streamed.compressed_rows, whole.compressed_rows, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    classes, (base, slots) = streamed.transitions
    whole_classes, whole_comb = whole.transitions
    np.testing.assert_array_equal(classes, whole_classes)
    np.testing.assert_array_equal(base, whole_comb.base)
    np.testing.assert_array_equal(slots, whole_comb.slots)
    np.testing.assert_array_equal(Comb(base, slots).columns(int(classes.max()) + 1)[:, classes], whole.table)


def lazy_form(vocab: Vocab, spec) -> CompiledConstraint:
    """A lazy form that no background thread completes (no cache path: nothing is queued)."""
    compiler_mod._MEMORY.clear()
    c = compile_constraint(spec, vocab, cache_dir=False)
    assert not c.compressed and c._finished is None
    return c


@SETTINGS
@given(regexes(), vocabs(), st.integers(0, 2**32 - 1))
def test_row_by_row_equals_compressing_the_dense_table(pattern, vocab, seed):
    """Whichever rows were computed before (read in place) and whichever not (computed into the
    scratch row), the arrays are the dense table's, and the lazy grammar computed nothing more."""
    dfa = compile_regex(pattern)
    whole = compile_dfa(dfa, vocab)
    lazy = CompiledConstraint.lazy(vocab, dfa)
    rng = np.random.default_rng(seed)
    for s in rng.permutation(lazy.num_states)[: int(rng.integers(0, lazy.num_states + 1))]:
        lazy.native.ensure(int(s))
    before = lazy.native.ready_rows
    assert_same_compressed(lazy.native.compact_all(), whole)
    assert lazy.native.ready_rows == before


def test_deltas_made_from_scratch_rows_are_the_same(json_vocab):  # noqa: F811
    """Free JSON values: large rows become delta bases while they sit in the scratch row (copied),
    or in place where a request computed them; either way the same deltas as from the dense table."""
    spec = {"json_schema": {"type": "array"}}
    whole = compile_constraint(spec, json_vocab, cache_dir=False).complete()
    assert (whole.compressed_rows[2] == DELTA).sum() >= 20
    for ready in ("none", "half", "all"):
        c = lazy_form(json_vocab, spec)
        states = {"none": [], "half": range(0, c.num_states, 2), "all": range(c.num_states)}[ready]
        for s in states:
            c.native.ensure(s)
        assert_same_compressed(c.native.compact_all(), whole)


@pytest.mark.parametrize("name", ["json_schema", "order_schema_12", "choice_200"])
def test_benchmark_constraints_row_by_row(name, wide_vocab):  # noqa: F811
    spec = bench_constraints()[name]
    whole = compile_constraint(spec, wide_vocab, cache_dir=False).complete()
    c = lazy_form(wide_vocab, spec)
    g = c.native.compact_all()
    assert_same_compressed(g, whole)
    c.adopt_compressed(g)
    assert c.compressed and c.nbytes == whole.nbytes
    np.testing.assert_array_equal(c.masks, whole.masks)


def test_past_max_bytes_gives_none(json_vocab):  # noqa: F811
    c = lazy_form(json_vocab, {"json_schema": {"type": "array"}})
    full = c.native.compact_all()
    held = sum(a.nbytes for a in full.compressed_rows)
    # the cap counts the arrays' capacity as they grow: at most twice what they hold at the end
    assert c.native.compact_all(2 * held + 4096) is not None
    assert c.native.compact_all(held - 1) is None
    assert c.native.compact_all(1) is None
    assert not c.compressed  # the form is untouched


def test_a_form_whose_dense_table_is_over_the_cap_is_completed_compressed(tiny_model_dir, tmp_path):
    """128 KiB a mask row and a 1 MiB cap: the dense table would pass it twice over; the compressed
    rows do not, so the background completion finishes and caches it, without computing a row into
    the lazy form's table (only the start and dead rows the compile made)."""
    from transformers import AutoTokenizer

    v = Vocab.from_hf_tokenizer(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    wide = Vocab(list(v.tokens), v.eos_ids, 1 << 20)
    compiler_mod._MEMORY.clear()
    set_limits(Limits(complete_max_mb=1))
    try:
        spec = {"regex": "[a-z]{3,9}@[a-z]{2,5}"}
        c = compile_constraint(spec, wide, cache_dir=tmp_path)
        assert c.dense_bytes > 2 << 20  # over the cap twice
        lazy = c.native
        assert c._finished is not None
        assert c._finished.done.wait(60)
    finally:
        set_limits(None)
    assert c.compressed and c.nbytes < 1 << 20
    assert lazy.ready_rows == 2  # the rows were never held dense
    assert (tmp_path / f"{c.key}.bin").exists()
    compiler_mod._MEMORY.clear()
    hit = load_cached(spec, wide, tmp_path)
    assert hit is not None and hit.compressed
    rng = np.random.default_rng(0)
    for s in rng.integers(0, c.num_states, size=8):
        np.testing.assert_array_equal(hit.allowed(int(s)), c.allowed(int(s)))


def test_a_form_past_the_cap_stays_lazy_and_uncached(json_vocab, tmp_path, monkeypatch, caplog):  # noqa: F811
    """The compressed rows pass the cap: the form keeps serving rows computed on demand, nothing is
    written to the cache, the log says why, and an explicit complete() still completes it."""
    monkeypatch.setattr(finisher_mod, "completed_max_bytes", lambda: 4096)
    compiler_mod._MEMORY.clear()
    spec = {"json_schema": {"type": "array"}}
    with caplog.at_level(logging.INFO, logger="llmserve.constraints.finisher"):
        c = compile_constraint(spec, json_vocab, cache_dir=tmp_path)
        assert c._finished is not None and c._finished.done.wait(60)
    assert not c.compressed
    assert "pass complete_max_mb" in caplog.text
    assert not list(tmp_path.glob("*.bin"))
    assert c.allowed(c.start).any()
    # the same constraint compiled again in this process is not tried again at the same cap
    compiler_mod._MEMORY.clear()
    again = compile_constraint(spec, json_vocab, cache_dir=tmp_path)
    assert again is not c and again._finished is None and not again.compressed
    c.complete()
    assert c.compressed


def test_a_completion_that_cannot_be_queued_is_never_waited_for(json_vocab, tmp_path, monkeypatch, caplog):  # noqa: F811
    monkeypatch.setattr(finisher_mod, "completed_max_bytes", lambda: 0)  # refused by the core
    compiler_mod._MEMORY.clear()
    with caplog.at_level(logging.ERROR, logger="llmserve.constraints.finisher"):
        c = compile_constraint({"json_schema": {"type": "array", "maxItems": 3}}, json_vocab, cache_dir=tmp_path)
    assert "could not be queued" in caplog.text
    assert c._finished is not None and c._finished.done.is_set()
    assert not finisher_mod.FINISHER._pending
    assert c.complete().compressed  # completes on this thread instead of waiting


class FailingOnce:
    """The core, except that its next finished_next() raises (as an allocation failing there would)."""

    def __init__(self, core) -> None:
        self._core = core
        self.failed = threading.Event()

    def finished_next(self) -> int:
        if not self.failed.is_set():
            self.failed.set()
            raise MemoryError("std::bad_alloc")
        return self._core.finished_next()

    def __getattr__(self, name: str):
        return getattr(self._core, name)


def test_the_finisher_thread_outlives_a_failure_of_finished_next(json_vocab, tmp_path, monkeypatch, caplog):  # noqa: F811
    """An error in the wait itself is logged and the thread goes on: later completions still finish
    (before, the thread ended and every later complete() waited forever for its completion)."""
    failing = FailingOnce(finisher_mod.core)
    monkeypatch.setattr(finisher_mod, "core", failing)
    monkeypatch.setattr(finisher_mod.Finisher, "RETRY_S", 0.01)
    compiler_mod._MEMORY.clear()
    with caplog.at_level(logging.ERROR, logger="llmserve.constraints.finisher"):
        # a thread already waiting in the core finishes this one, then fails; a new one fails first
        first = compile_constraint({"json_schema": {"type": "array", "maxItems": 3}}, json_vocab, cache_dir=tmp_path)
        assert first.wait_completed(60)
        assert failing.failed.wait(60)
        second = compile_constraint({"json_schema": {"type": "array", "maxItems": 4}}, json_vocab, cache_dir=tmp_path)
        assert second.wait_completed(60)
    assert "failed; going on" in caplog.text
    assert finisher_mod.FINISHER.thread is not None and finisher_mod.FINISHER.thread.is_alive()


def test_rows_read_across_the_swap_are_whole(json_vocab):  # noqa: F811
    """A reader that took the lazy rows just before the compressed form was swapped in, and one
    after: the rows it returns are computed ones, never the lazy table's missing (zero) rows."""
    spec = {"json_schema": {"type": "array"}}
    whole = compile_constraint(spec, json_vocab, cache_dir=False).complete()
    c = lazy_form(json_vocab, spec)
    lazy_native, masks = c.native, c._masks
    c.adopt_compressed(lazy_native.compact_all())
    assert c._masks is None and c.nbytes == whole.nbytes
    # the reader's view before the swap: the dense rows it held, the grammar it reads after them
    c._masks = masks
    for s in range(c.num_states):
        np.testing.assert_array_equal(c.mask_row(s), whole.masks[s])
    assert lazy_native.ready_rows == 2  # read from the compressed rows, not computed into the old table
    c._masks = None
    np.testing.assert_array_equal(c.mask_row(-1), whole.masks[-1])
