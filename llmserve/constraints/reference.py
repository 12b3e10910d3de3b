"""Pure-Python reference of the native core (``llmserve.constraints._core``).

Same interface, same results, bit for bit: ``compile_masks``, ``step`` and ``ReferenceBatch``
(``set_row``/``clear_row``/``move``/``swap``/``sync``/``fill``/``fill_apply``/``row``) and
``apply_bitmask``. Written for clarity, not speed; the property tests in tests/constraints compare
it with the C++ core over random constraints, vocabularies, token streams and batch changes.
"""

from __future__ import annotations

import numpy as np


def compile_masks(vocab, table: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """Row s: tokens whose bytes walk the DFA from s without reaching the dead state, plus the
    end-of-sequence ids when s accepts (or when nothing else is allowed). Row S: end of sequence only."""
    S = int(table.shape[0])
    W = vocab.words
    rows = [[0] * W for _ in range(S + 1)]
    t = table.tolist()
    for s in range(S):
        row = rows[s]
        for tok in range(vocab.size):
            data = vocab.token_bytes(tok)
            if not data:
                continue
            cur = s
            for b in data:
                cur = t[cur][b]
                if cur < 0:
                    break
            if cur >= 0:
                row[tok >> 5] |= 1 << (tok & 31)
        if accept[s] or not any(row):
            for e in vocab.eos_ids:
                row[e >> 5] |= 1 << (e & 31)
    for e in vocab.eos_ids:
        rows[S][e >> 5] |= 1 << (e & 31)
    return np.array(rows, dtype=np.uint32).reshape(S + 1, W)


def step(vocab, table, accept, state: int, token: int) -> int:
    if state < 0 or token < 0 or token >= vocab.size:
        return -1
    if token in vocab.eos_ids:
        return state if accept[state] else -1
    data = vocab.token_bytes(token)
    if not data:
        return -1
    for b in data:
        state = int(table[state][b])
        if state < 0:
            return -1
    return state


def apply_bitmask(logits: np.ndarray, bitmask: np.ndarray, active=None) -> None:
    B, V = logits.shape
    for r in range(B):
        if active is not None and not active[r]:
            continue
        for t in range(V):
            if not (int(bitmask[r, t >> 5]) >> (t & 31)) & 1:
                logits[r, t] = -np.inf


class _Row:
    __slots__ = ("consumed", "grammar", "last", "state", "tokens")

    def __init__(self, grammar=None, tokens=None):
        self.grammar = grammar
        self.tokens = tokens
        self.state = grammar.start if grammar is not None else 0
        self.consumed = 0
        self.last = -1


class ReferenceBatch:
    """Rows of the persistent batch; each row's state is derived from the token list it holds."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.rows: list[_Row] = []

    def _ensure(self, n):
        while len(self.rows) < n:
            self.rows.append(_Row())

    def set_row(self, index, grammar, tokens):
        self._ensure(index + 1)
        self.rows[index] = _Row(grammar, tokens)

    def clear_row(self, index):
        if index < len(self.rows):
            self.rows[index] = _Row()

    def move(self, src, dst):
        self._ensure(max(src, dst) + 1)
        if src != dst:
            self.rows[dst] = self.rows[src]
            self.rows[src] = _Row()

    def swap(self, a, b):
        self._ensure(max(a, b) + 1)
        self.rows[a], self.rows[b] = self.rows[b], self.rows[a]

    def sync(self, n):
        rebuilt = 0
        for row in self.rows[:n]:
            g = row.grammar
            if g is None or row.tokens is None:
                continue
            toks = row.tokens
            if len(toks) < row.consumed or (row.consumed > 0 and toks[row.consumed - 1] != row.last):
                row.state, row.consumed = g.start, 0
                rebuilt += 1
            for tok in toks[row.consumed :]:
                row.state = g.step(row.state, tok)
            row.consumed = len(toks)
            row.last = toks[-1] if toks else -1
        return rebuilt

    def _row_mask(self, r, W):
        row = self.rows[r] if r < len(self.rows) else None
        if row is None or row.grammar is None:
            return None
        g = row.grammar
        src = g.mask_row(row.state)
        out = np.zeros(W, dtype=np.uint32)
        n = min(W, src.shape[0])
        out[:n] = src[:n]
        return out

    def fill(self, out, active=None, n=-1, nthreads=0):
        B = out.shape[0] if n < 0 else min(n, out.shape[0])
        self._ensure(B)
        for r in range(B):
            m = self._row_mask(r, out.shape[1])
            if m is None:
                out[r] = 0xFFFFFFFF
            else:
                out[r] = m
            if active is not None:
                active[r] = 0 if m is None else 1

    def fill_apply(self, logits, out=None, nthreads=0):
        B, V = logits.shape
        W = out.shape[1] if out is not None else (V + 31) // 32
        self._ensure(B)
        for r in range(B):
            m = self._row_mask(r, W)
            if out is not None:
                out[r] = 0xFFFFFFFF if m is None else m
            if m is not None:
                apply_bitmask(logits[r : r + 1], m.reshape(1, -1))

    def row(self, index):
        if index >= len(self.rows) or self.rows[index].grammar is None:
            return (None, 0)
        return (self.rows[index].state, self.rows[index].consumed)
