"""A compressed form's automaton as the core holds it: its byte-class columns packed as a comb
(``csrc/comb.h``).

A JSON schema's automaton moves on a few of its ~50-80 byte classes per state, so once its mask rows
are shared the class columns were most of a large form's memory (5-11% of their entries live in the
large SchemaStore forms). The comb keeps one (owner, next) slot per live entry: the next state from s
on a byte of class c is ``slots[base[s] + c, 1]`` when ``slots[base[s] + c, 0] == s``, else none (-1).
Lazy forms keep the construction's columns; only the compressed form (and its cache file) is a comb.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray


class Comb(NamedTuple):
    """base int32[S]; slots [N, 2] (owner, next), int16 where the automaton has at most 32,767
    states, else int32. Every ``base[s] + C <= N`` (C: the classes' count), so no lookup leaves the
    slots."""

    base: NDArray[np.int32]
    slots: NDArray[np.int16] | NDArray[np.int32]

    @property
    def nbytes(self) -> int:
        return int(self.base.nbytes + self.slots.nbytes)

    @property
    def num_states(self) -> int:
        return int(self.base.shape[0])

    def columns(self, n_classes: int) -> NDArray[np.int32]:
        """The class columns int32[S, n_classes] it packs (for tests, numpy fallbacks and tools; the
        core reads the comb as it is)."""
        at = self.base.astype(np.int64)[:, None] + np.arange(n_classes)[None, :]
        owner, nxt = self.slots[at, 0], self.slots[at, 1]
        mine = owner == np.arange(self.num_states)[:, None]
        return np.where(mine, nxt, -1).astype(np.int32)


def class_columns(
    table: NDArray[np.int16] | NDArray[np.int32] | Comb, classes: NDArray[np.uint8]
) -> NDArray[np.int16] | NDArray[np.int32]:
    """The columns over ``classes`` of a table held either way."""
    if isinstance(table, tuple):
        return Comb(*table).columns(int(np.asarray(classes).max()) + 1)
    return table
