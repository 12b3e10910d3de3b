"""Large mask rows held once per process for every form over the vocabulary (shared_rows.py;
csrc/grammar.h, CompactRows::kShared): what fills read is unchanged, the rows are one copy, freed
with the last form, and cache files stay self-contained."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from test_compressed_rows import json_vocab  # noqa: F401 (fixture)

from llmserve.constraints import compile_constraint, disk_cache
from llmserve.constraints import compiler as compiler_mod
from llmserve.constraints.compiled import CompiledConstraint
from llmserve.constraints.native import native, native_vocab, require_native
from llmserve.constraints.shared_rows import DELTA, POOL, SHARED, WORDS, RowPool, share, unshare

require_native()

ORDER = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["id"],
}
NOTE = {"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"}}}


def complete(spec, vocab, cache_dir=False):
    compiler_mod._MEMORY.clear()
    return compile_constraint({"json_schema": spec}, vocab, cache_dir=cache_dir).complete()


def dense_masks(c, vocab) -> np.ndarray:
    return native.compile_masks(native_vocab(vocab), c.table, c.accept)


def test_forms_name_one_copy_of_their_common_rows(json_vocab):  # noqa: F811
    a, b = complete(ORDER, json_vocab), complete(NOTE, json_vocab)
    assert a._shared and b._shared
    common = {id(w) for _, w in a._shared} & {id(w) for _, w in b._shared}
    assert common  # a free string's row, at least: the same array in both
    for c in (a, b):
        np.testing.assert_array_equal(c.masks, dense_masks(c, json_vocab))
        held = sum(w.nbytes for _, w in c._shared)
        assert c.nbytes - c.private_nbytes == held > 0
        kind = c._rows[2]
        assert (kind == SHARED).sum() == len(c._shared)
        for _, words in c._shared:
            with pytest.raises(ValueError):  # read unchecked by every grammar that names it
                words.flags.writeable = True
    # a delta row over a shared base expands through it
    _row_of, off, kind, data = a._rows
    bases = [int(data[off[r]]) for r in np.flatnonzero(kind == DELTA)]
    assert any(kind[base] == SHARED for base in bases)


def test_the_rows_as_a_file_holds_them_are_whole(json_vocab, tmp_path):  # noqa: F811
    live = complete(ORDER, json_vocab)
    c = complete(ORDER, json_vocab, cache_dir=tmp_path)
    whole = c.compressed_rows
    assert whole is not None and SHARED not in set(whole[2].tolist())
    back, _ = share(whole, json_vocab.digest)
    for x, y in zip(back, c._rows, strict=True):
        np.testing.assert_array_equal(x, y)
    _header, arrays = disk_cache.read_arrays(tmp_path / f"{c.key}.bin", c.key)
    assert SHARED not in set(arrays["kind"].tolist())
    hit = disk_cache.read_cache(tmp_path / f"{c.key}.bin", json_vocab)
    assert hit is not None and hit._shared
    assert {id(w) for _, w in hit._shared} <= {id(w) for _, w in live._shared}  # the live form's copies
    np.testing.assert_array_equal(hit.masks, dense_masks(live, json_vocab))
    # none of the file's buffer is kept once its large rows are shared: every array owns its memory
    for array in (hit.accept, *hit.transitions[1], hit._rows[0]):
        assert not isinstance(array.base, np.ndarray)


def test_a_row_is_freed_with_the_last_form_that_names_it(json_vocab):  # noqa: F811
    pool = RowPool()
    c = complete(NOTE, json_vocab)
    rows = unshare(c._rows, c._shared)
    held, shared = share(rows, "v", pool)
    again, shared_again = share(rows, "v", pool)
    assert [id(w) for _, w in shared] == [id(w) for _, w in shared_again]
    assert len(pool) == len(shared) and pool.nbytes == sum(w.nbytes for _, w in shared)
    _other, elsewhere = share(rows, "another vocabulary", pool)
    assert len(pool) == 2 * len(shared) and not {id(w) for _, w in elsewhere} & {id(w) for _, w in shared}
    del shared, shared_again, elsewhere, held, again, _other
    gc.collect()
    assert len(pool) == 0 and pool.nbytes == 0


def test_rows_naming_shared_rows_are_checked(json_vocab):  # noqa: F811
    c = complete(ORDER, json_vocab)
    classes, comb = c.transitions
    nv = native_vocab(json_vocab)
    row_of, off, kind, data = c._rows
    ok = native.Grammar.compressed(nv, classes, comb, c.accept, row_of, off, kind, data, c.start, c._shared)
    assert ok.walk(c.start, []) == c.start
    with pytest.raises(ValueError, match="shared row's index"):  # a reference past the shared rows
        native.Grammar.compressed(nv, classes, comb, c.accept, row_of, off, kind, data, c.start, c._shared[:-1])
    how, words = c._shared[0]
    for bad, why in (
        (((1, words), *c._shared[1:]), "shared row's kind"),  # ids are never shared
        (((5, words), *c._shared[1:]), "shared row's kind"),  # nor a reference to another
        (((how, words[:-1]), *c._shared[1:]), "length"),
        (((how,), *c._shared[1:]), "pairs"),
        ((("3", words), *c._shared[1:]), "shared row's kind"),
    ):
        with pytest.raises(ValueError, match=why):
            native.Grammar.compressed(nv, classes, comb, c.accept, row_of, off, kind, data, c.start, bad)


def test_the_process_pool_holds_each_row_once(json_vocab):  # noqa: F811
    a, b = complete(ORDER, json_vocab), complete(NOTE, json_vocab)
    distinct = {id(w): w.nbytes for c in (a, b) for _, w in c._shared}
    assert POOL.nbytes >= sum(distinct.values())
    assert sum(distinct.values()) < sum(w.nbytes for c in (a, b) for _, w in c._shared)


def test_a_grammar_naming_shared_rows_is_held_as_any_other(json_vocab, tmp_path):  # noqa: F811
    """A form made of a core grammar that names shared rows already: the rows in place again, then
    shared with this process's (no reference left dangling, the file written whole and read back)."""
    c = complete(ORDER, json_vocab)
    assert c.native.shared_rows
    again = CompiledConstraint.from_compressed(json_vocab, c.native, c.accept, "k" * 64)
    assert [id(w) for _, w in again._shared] == [id(w) for _, w in c._shared]
    assert again.nbytes == c.nbytes and again.private_nbytes == c.private_nbytes
    assert SHARED not in set(again.compressed_rows[2].tolist())
    np.testing.assert_array_equal(again.masks, dense_masks(c, json_vocab))
    disk_cache.write_cache(tmp_path / f"{again.key}.bin", again)
    hit = disk_cache.read_cache(tmp_path / f"{again.key}.bin", json_vocab)
    assert hit is not None
    np.testing.assert_array_equal(hit.masks, again.masks)


def test_rows_whose_checksums_collide_are_never_confused(monkeypatch):
    """The pool keys rows by a fast checksum and compares the words before handing out a copy: two
    different rows under one key each come back as themselves."""
    from llmserve.constraints import shared_rows

    monkeypatch.setattr(shared_rows, "core", type("Colliding", (), {"checksum": staticmethod(lambda words, seed: 7)}))
    pool = RowPool()
    a = np.arange(300, dtype=np.uint32)
    b = a[::-1].copy()
    held_a = pool.intern("v", WORDS, a)
    held_b = pool.intern("v", WORDS, b)
    assert np.array_equal(held_a, a) and np.array_equal(held_b, b)
    assert np.array_equal(pool.intern("v", WORDS, b.copy()), b)


def test_sharing_and_unsharing_keep_every_row_in_order():
    """Mixed rows (small, large words and dense, deltas) through share and unshare: the same rows,
    each large one named once, against a row-by-row rebuild."""
    rng = np.random.default_rng(5)
    lengths = [3, 300, 0, 512, 7, 256, 255, 1]
    kinds = [0, 0, DELTA, 3, 1, 3, 0, 2]
    words = [rng.integers(0, 2**32, n, dtype=np.uint32) for n in lengths]
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rows = (np.arange(len(lengths), dtype=np.int32), off, np.array(kinds, np.uint8), np.concatenate(words))
    held, shared = share(rows, "v", RowPool())
    large = [i for i, (n, k) in enumerate(zip(lengths, kinds, strict=True)) if n >= 256 and k in (0, 3)]
    assert [int(k) for k in held[2]] == [SHARED if i in large else k for i, k in enumerate(kinds)]
    for i in range(len(lengths)):
        got = held[3][held[1][i] : held[1][i + 1]]
        if i in large:
            kind, named = shared[int(got[0])]
            assert got.shape == (1,) and kind == kinds[i] and np.array_equal(named, words[i])
        else:
            assert np.array_equal(got, words[i])
    back = unshare(held, shared)
    assert all(np.array_equal(x, y) for x, y in zip(back, rows, strict=True))


def test_the_in_memory_cache_counts_each_shared_row_once(json_vocab):  # noqa: F811
    """Two forms naming common rows cost the cache their own bytes and each common row once
    (``MemoryCache`` itself: tests/constraints/test_caches.py)."""
    compiler_mod._MEMORY.clear()
    order = compile_constraint({"json_schema": ORDER}, json_vocab, cache_dir=False).complete()
    note = compile_constraint({"json_schema": NOTE}, json_vocab, cache_dir=False).complete()
    common = {id(w) for w in order.shared_words} & {id(w) for w in note.shared_words}
    assert common
    union = {id(w): w for w in (*order.shared_words, *note.shared_words)}
    both = order.private_nbytes + note.private_nbytes + sum(w.nbytes for w in union.values())
    assert compiler_mod._MEMORY.nbytes == both < order.nbytes + note.nbytes
