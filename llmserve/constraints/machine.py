"""Public API for custom constraints.

Two ways to write one:

* ``ByteAutomaton``: a finite automaton over bytes (``start``, ``step(state, byte)``, ``accepting``).
  It is explored into a byte DFA and compiled like the built-in kinds, so it runs on the native
  fast path (masks precomputed per state, flat per-row cost). States must be hashable and finite.

* ``TokenStateMachine``: arbitrary Python logic per token (``start``, ``advance``, ``allowed``,
  ``is_final``). It runs in Python for its own rows only; built-in and automaton rows stay native.

Register either under a name with :func:`register_machine` (in-process) or through the entry-point
group ``llmserve.constraint_machines`` (a factory ``f(vocab, **args)``); a request then selects it
with ``{"machine": "name", "args": {...}}``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable
from importlib import metadata

import numpy as np

from llmserve.constraints.errors import ConstraintError
from llmserve.constraints.regex import MAX_DFA_STATES, ByteDFA, _trim_and_minimize

ENTRY_POINT_GROUP = "llmserve.constraint_machines"


class ByteAutomaton(ABC):
    """A finite automaton over bytes; ``step`` returns the next state or None (reject)."""

    @abstractmethod
    def start(self) -> Hashable: ...

    @abstractmethod
    def step(self, state: Hashable, byte: int) -> Hashable | None: ...

    @abstractmethod
    def accepting(self, state: Hashable) -> bool: ...


class TokenStateMachine(ABC):
    """A state machine over token ids, evaluated in Python.

    ``advance`` returns the next state, or None when the token is not allowed (the row then allows
    end of sequence only). ``allowed`` returns the allowed token ids, or a boolean array over the
    vocabulary. ``is_final`` says whether end of sequence is allowed.
    """

    @abstractmethod
    def start(self) -> object: ...

    @abstractmethod
    def advance(self, state: object, token: int) -> object | None: ...

    @abstractmethod
    def allowed(self, state: object) -> Iterable[int] | np.ndarray: ...

    @abstractmethod
    def is_final(self, state: object) -> bool: ...


def automaton_to_dfa(automaton: ByteAutomaton, max_states: int = MAX_DFA_STATES) -> ByteDFA:
    """Explore every state reachable from ``start`` into a trimmed, minimal byte DFA."""
    start = automaton.start()
    index = {start: 0}
    order = [start]
    table: list[list[int]] = []
    accept: list[bool] = []
    i = 0
    while i < len(order):
        s = order[i]
        i += 1
        accept.append(bool(automaton.accepting(s)))
        row = [-1] * 256
        for b in range(256):
            nxt = automaton.step(s, b)
            if nxt is None:
                continue
            j = index.get(nxt)
            if j is None:
                if len(order) >= max_states:
                    raise ConstraintError(f"automaton has more than {max_states} reachable states")
                j = index[nxt] = len(order)
                order.append(nxt)
            row[b] = j
        table.append(row)
    return _trim_and_minimize(table, accept)


_REGISTRY: dict[str, Callable] = {}


def register_machine(name: str, factory: Callable) -> None:
    """Register ``factory(vocab, **args) -> ByteAutomaton | TokenStateMachine`` under ``name``."""
    _REGISTRY[name] = factory


def registered_machines() -> dict[str, Callable | metadata.EntryPoint]:
    """Name -> factory: the registered ones, and the entry points (loaded by ``make_machine`` on use)."""
    out: dict[str, Callable | metadata.EntryPoint] = {}
    try:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            out[ep.name] = ep
    except Exception:  # pragma: no cover - broken metadata never breaks serving
        pass
    out.update(_REGISTRY)
    return out


def make_machine(name: str, vocab, args: dict | None):
    factories = registered_machines()
    if name not in factories:
        raise ConstraintError(f"unknown constraint machine {name!r}; registered: {sorted(factories) or 'none'}")
    factory = factories[name]
    if isinstance(factory, metadata.EntryPoint):
        factory = factory.load()
    machine = factory(vocab, **(args or {}))
    if not isinstance(machine, (ByteAutomaton, TokenStateMachine)):
        raise ConstraintError(f"machine {name!r} is neither a ByteAutomaton nor a TokenStateMachine")
    return machine


class PythonRow:
    """A TokenStateMachine row, with the same history-derived sync as the native rows."""

    __slots__ = ("consumed", "last", "machine", "size", "state", "tokens")

    def __init__(self, machine: TokenStateMachine, tokens: list[int], size: int):
        self.machine = machine
        self.tokens = tokens
        self.size = size
        self.state = machine.start()
        self.consumed = 0
        self.last = -1

    def sync(self) -> None:
        toks = self.tokens
        if len(toks) < self.consumed or (self.consumed > 0 and toks[self.consumed - 1] != self.last):
            self.state, self.consumed = self.machine.start(), 0
        for tok in toks[self.consumed :]:
            if self.state is not None:
                self.state = self.machine.advance(self.state, tok)
        self.consumed = len(toks)
        self.last = toks[-1] if toks else -1

    def allowed_mask(self, eos_ids) -> np.ndarray:
        mask = np.zeros(self.size, dtype=bool)
        if self.state is None:
            mask[list(eos_ids)] = True
            return mask
        allowed = self.machine.allowed(self.state)
        if isinstance(allowed, np.ndarray) and allowed.dtype == bool:
            mask[: allowed.shape[0]] = allowed[: self.size]
        else:
            ids = np.fromiter(allowed, dtype=np.int64)
            mask[ids[(ids >= 0) & (ids < self.size)]] = True
        if self.machine.is_final(self.state) or not mask.any():
            mask[list(eos_ids)] = True
        return mask
