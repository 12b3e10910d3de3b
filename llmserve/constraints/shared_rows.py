"""Mask rows held once per process for every constraint over the same vocabulary.

The large rows of a compressed form (plain words, or partial words with their bitmap: 12.5 KB each
at a 100k vocabulary) are mostly the same few rows in every JSON schema: a free string's content at
each depth, a number's digits, any value. Across 39 SchemaStore forms at cl100k_base they were 6.1
of the forms' 14.9 MB, and 2.2 MB of it distinct (five such rows were in all 39 forms). A form holds
those rows as references (``csrc/grammar.h``, ``CompactRows::kShared``: the row's index into the
form's ``shared`` rows) to one read-only copy kept here per (vocabulary, kind, words), for as long as
some form holds it (a weak reference: the last form to go frees it).

Files and ``CompiledConstraint.compressed_rows`` keep every row in place (``unshare``): a cache file
does not depend on what a process holds; a form read from one is shared again as it is loaded.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref

import numpy as np
from numpy.typing import NDArray

from llmserve.constraints.native import native as core

# compressed mask rows, as the core lays them out (csrc/grammar.h, CompactRows): row_of, off, kind, data
Rows = tuple[NDArray[np.int32], NDArray[np.int64], NDArray[np.uint8], NDArray[np.uint32]]
# the rows a form's kind-5 rows name: (kind, words) each
Shared = tuple[tuple[int, NDArray[np.uint32]], ...]

WORDS, DENSE, DELTA, SHARED = 0, 3, 4, 5  # CompactRows' kinds
MIN_WORDS = 256  # smaller rows stay in their form: a reference and the pool's entry cost ~300 bytes


class RowPool:
    """(vocabulary, kind, words) -> the one read-only copy of those words, while a form holds it."""

    def __init__(self) -> None:
        # reentrant: a row freed while the lock is held (a form dropped inside ``intern``) calls back
        self._lock = threading.RLock()
        self._rows: dict[tuple[str, int, int, int], weakref.ref] = {}
        os.register_at_fork(after_in_child=self._forked)

    def intern(self, vocab_key: str, kind: int, words: NDArray[np.uint32]) -> NDArray[np.uint32]:
        # a fast non-cryptographic checksum (csrc/checksum.h): the words are compared before a copy is
        # handed out, so a collision only costs sharing (13x cheaper than blake2b, paid on each cache hit)
        key = (vocab_key, kind, words.shape[0], core.checksum(words, 0))
        with self._lock:
            ref = self._rows.get(key)
            held = ref() if ref is not None else None
            if held is not None and np.array_equal(held, words):
                return held
            row = frozen(words)  # the core checked it once for each form that names it
            self._rows[key] = weakref.ref(row, functools.partial(self._forget, key))
            return row

    def _forget(self, key: tuple[str, int, int, int], dead: weakref.ref) -> None:
        with self._lock:
            if self._rows.get(key) is dead:
                del self._rows[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    @property
    def nbytes(self) -> int:
        """The rows held now (each once)."""
        with self._lock:
            rows = [ref() for ref in self._rows.values()]
        return int(sum(r.nbytes for r in rows if r is not None))

    def _forked(self) -> None:
        self._lock = threading.RLock()  # a parent thread may have held it at the fork


POOL = RowPool()


def frozen(a: NDArray) -> NDArray:
    """A copy of ``a`` that cannot be made writable again (over immutable bytes): arrays the core
    checked once and then reads unchecked."""
    return np.ndarray(a.shape, dtype=a.dtype, buffer=np.ascontiguousarray(a).tobytes())


def _replaced(
    off: NDArray[np.int64], data: NDArray[np.uint32], which: NDArray[np.intp], words: list[NDArray[np.uint32]]
) -> tuple[NDArray[np.int64], NDArray[np.uint32]]:
    """(off, data) with the rows ``which`` (ascending) holding ``words`` instead; the others kept."""
    lengths = np.diff(off)
    new_lengths = lengths.copy()
    new_lengths[which] = [w.shape[0] for w in words]
    new_off = np.zeros_like(off)
    np.cumsum(new_lengths, out=new_off[1:])
    new_data = np.empty(int(new_off[-1]), np.uint32)
    kept = np.ones(lengths.shape[0], bool)
    kept[which] = False
    new_data[np.repeat(kept, new_lengths)] = data[np.repeat(kept, lengths)]
    for r, w in zip(which.tolist(), words, strict=True):
        new_data[new_off[r] : new_off[r + 1]] = w
    return new_off, new_data


def share(rows: Rows, vocab_key: str, pool: RowPool = POOL) -> tuple[Rows, Shared]:
    """``rows`` with each large word or dense row replaced by a reference to the pool's copy, and the
    rows those references name; ``rows`` itself (and no shared rows) when none is large."""
    row_of, off, kind, data = rows
    large = np.flatnonzero(((kind == WORDS) | (kind == DENSE)) & (np.diff(off) >= MIN_WORDS))
    if large.shape[0] == 0:
        return rows, ()
    shared = tuple((int(kind[r]), pool.intern(vocab_key, int(kind[r]), data[off[r] : off[r + 1]])) for r in large)
    references = [np.array([i], np.uint32) for i in range(large.shape[0])]
    new_off, new_data = _replaced(off, data, large, references)
    new_kind = kind.copy()
    new_kind[large] = SHARED
    return (row_of, frozen(new_off), frozen(new_kind), frozen(new_data)), shared


def unshare(rows: Rows, shared: Shared) -> Rows:
    """The same rows with every shared one back in place: the layout a cache file holds."""
    if not shared:
        return rows
    row_of, off, kind, data = rows
    named = np.flatnonzero(kind == SHARED)
    picked = [shared[int(data[off[r]])] for r in named]
    new_off, new_data = _replaced(off, data, named, [words for _how, words in picked])
    new_kind = kind.copy()
    new_kind[named] = [how for how, _words in picked]
    return row_of, new_off, new_kind, new_data


def shared_nbytes(shared: Shared) -> int:
    return int(sum(words.nbytes for _, words in shared))
