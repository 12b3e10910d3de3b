"""The compiled form of a constraint: a byte DFA compiled against one vocabulary.

A constraint compiles in two stages: the spec becomes a byte-level DFA (``regex.py``,
``jsonschema.py``; built by the C++ core), then the DFA is compiled against the tokenizer's
vocabulary into one packed bitmask row per DFA state (``masks[s]``: the tokens allowed in state s).
At decode time a row's state advances by walking the sampled token's bytes through the DFA, and the
mask fill writes ``masks[state]``'s words: cost per row is flat, whatever the constraint.

A complete form keeps its rows compressed (``csrc/grammar.h``, ``CompactRows``): each distinct row
once, as its allowed ids, its refused ids, its partial words or its plain words, the smallest once
weighed by what each costs a fill, or as the few words where it differs from an earlier large row
(free strings at each depth of a JSON value); and its automaton as byte classes whose columns are
packed as a comb (``comb.py``, ``csrc/comb.h``). Its large rows (a free string's, a number's) recur
in most schemas and are held once per process for all of them (``shared_rows.py``). Fills expand a
row's words straight into the bitmask, or into a chunk buffer the logits pass reads from L1. A
2,000-state schema over 100k tokens takes 2-3 MB instead of 26 MB (``benchmarks/constraints/
memory.py``); ``nbytes`` counts what a form holds now.

Mask rows may be computed lazily (``CompiledConstraint.lazy``): the form is usable once the DFA and
the start state's row exist, a row is computed the first time a batch row needs it, and the rest
can be completed in the background (``finisher.py``). ``compiler.py`` decides which, and caches the
complete forms on disk (``disk_cache.py``).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from llmserve.constraints import reference
from llmserve.constraints.budget import UNREACHABLE, steerable_from, token_distances
from llmserve.constraints.budget import distances as byte_distances
from llmserve.constraints.comb import Comb, class_columns
from llmserve.constraints.native import native as core
from llmserve.constraints.native import native_vocab, require_native
from llmserve.constraints.regex import ByteDFA
from llmserve.constraints.shared_rows import Rows, Shared, frozen, share, shared_nbytes, unshare
from llmserve.constraints.vocab import Vocab

log = logging.getLogger(__name__)

# One constraint's exact distances at a time: each costs a vocabulary walk per state and round
# (seconds of a core for a large schema), and a burst of new constraints must not take every core
# from decoding; steering meanwhile uses the single-byte bound. A child forked while the parent held
# the slot gets a free one.
_EXACT_SLOT = threading.Lock()


def _free_exact_slot() -> None:
    global _EXACT_SLOT
    _EXACT_SLOT = threading.Lock()


os.register_at_fork(after_in_child=_free_exact_slot)

# an automaton over byte classes: classes uint8[256] and a lazy form's columns, one per class, int32[S, C]
# (the next state from s on byte b is table[s, classes[b]]), or a compressed form's comb of them
# (comb.py; csrc/vocab_trie.h, Transitions)
ByteClasses = tuple[NDArray[np.uint8], NDArray[np.int16] | NDArray[np.int32] | Comb]


@dataclass(frozen=True)
class Completion:
    """A background thread's promise to complete a lazily compiled constraint: ``done`` is set once
    its compressed rows are swapped in and the cache file written, or once it gave up (the form stays
    lazy). ``thread`` never waits for its own promise, and
    nothing waits for it in a forked child (``pid``: the process that has the thread)."""

    thread: threading.Thread
    done: threading.Event = field(default_factory=threading.Event)
    pid: int = field(default_factory=os.getpid)


def _sparse_rows(rows: int, words: int) -> NDArray[np.uint32]:
    """A uint32[rows, words] (zeros, untouched) whose memory is backed page by page as rows are written.
    numpy asks the kernel for huge pages on large arrays (2 MiB each: one row written there backs
    about 160 rows' worth at a 100k vocabulary), which would make a lazy form hold far more than the
    rows it computed, and more than the cache counts; an anonymous mapping kept off huge pages does
    not."""
    # private: a forked child writing rows (it computes those the parent had not) must write its own
    # copies, never the parent's pages (mmap's default for an anonymous map is MAP_SHARED)
    buf = mmap.mmap(-1, rows * words * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: small pages already
            pass
    return np.frombuffer(buf, dtype=np.uint32).reshape(rows, words)


def _held(
    vocab: Vocab, g: core.Grammar, accept: NDArray[np.uint8]
) -> tuple[Rows, Shared, ByteClasses, NDArray[np.uint8], core.Grammar]:
    """A compressed core grammar's arrays as a form holds them (rows, the shared rows they name, the
    automaton with its comb wrapped, acceptance) and the grammar over those: ``g`` where no row is
    shared, else a new one (``g``'s copies of the shared rows are freed with it)."""
    rows, transitions = g.compressed_rows, g.transitions
    if rows is None or transitions is None:
        raise ValueError("not a compressed grammar")
    classes, table = transitions
    # (a grammar that names shared rows already: in place again first, then shared with this process's)
    rows, shared = share(unshare(rows, g.shared_rows or ()), vocab.digest)
    if shared:
        # arrays that are views into one buffer (a cache file's) would keep all of it, the shared
        # rows' words included: copied, so that it is freed
        def own(a):
            return frozen(a) if isinstance(a.base, np.ndarray) else a

        classes, accept = own(classes), own(accept)
        table = tuple(own(a) for a in table) if isinstance(table, tuple) else own(table)
        rows = (own(rows[0]), *rows[1:])
    # the core's comb; columns where a grammar was made over them
    held: ByteClasses = (classes, Comb(*table)) if isinstance(table, tuple) else (classes, table)
    if shared:
        g = core.Grammar.compressed(native_vocab(vocab), classes, held[1], accept, *rows, g.start, shared)
    return rows, shared, held, accept, g


class CompiledConstraint:
    """A DFA compiled against one vocabulary: ``table`` int32[S,256], ``accept`` uint8[S],
    mask rows uint32[S+1, W] (row S: the dead row, end of sequence only), start state 0; the rows
    dense (``masks`` given) or compressed (``rows``: the core's (row_of, off, kind, data)). The
    automaton is a dense ``table`` or byte classes, ``transitions`` (always once compressed; a lazy
    form takes the construction's own); ``table`` then expands the dense table on each read.

    ``ready=False``: the mask rows are filled in lazily by the native core (see the module doc);
    ``masks`` then waits for all of them, ``allowed(s)`` computes just row s.
    """

    def __init__(
        self,
        vocab: Vocab,
        table: NDArray[np.int32] | None,
        accept: NDArray[np.uint8],
        masks: NDArray[np.uint32] | None,
        start: int = 0,
        key: str = "",
        ready: bool = True,
        rows: Rows | None = None,
        transitions: ByteClasses | None = None,
        shared: Shared = (),
    ):
        if (
            (masks is None) == (rows is None)
            or (table is None) == (transitions is None)
            or (rows is not None and table is not None)
        ):
            raise ValueError("give masks with a dense table or with transitions, or compressed rows with transitions")
        self.vocab = vocab
        self._table = table
        self._transitions = transitions
        self.accept = accept
        self._masks = masks
        self._rows = rows
        self._shared = shared  # the rows `rows` names (shared_rows.py)
        self._compress_lock = threading.Lock()
        # called with this form once its rows are compressed (the in-memory cache re-counts its size)
        self.on_compressed: Callable[[CompiledConstraint], None] | None = None
        # called with the exact distances once the background thread has them (kept for other processes)
        self.on_distances: Callable[[NDArray[np.int32]], None] | None = None
        self.start = int(start)
        self.key = key
        self._ready = ready
        self._native: core.Grammar | None = None
        self._finished: Completion | None = None  # set by the background finisher
        self._distances: NDArray[np.int32] | None = None
        # steering (the decode loop): the distances it uses now, and what it keeps computed from them
        self._steer_dist: NDArray[np.int32] | None = None
        self._bound: NDArray[np.int32] | None = None  # single-byte distances, until the exact ones exist
        self._exact_started = False  # the background search for the exact ones
        self._exact_later: NDArray[np.int32] | None = None  # set by the background thread
        self._max_distance: int | None = None
        self._budget_rows: dict[tuple[int, int], NDArray[np.uint32] | None] = {}

    @classmethod
    def lazy(cls, vocab: Vocab, dfa: ByteDFA, key: str = "") -> CompiledConstraint:
        """Only the start state's and the dead row are computed now. Keeps the automaton in the form
        ``dfa`` holds (byte classes from the native construction: a fraction of a byte table)."""
        accept = np.ascontiguousarray(dfa.accept, dtype=np.uint8)
        table: NDArray[np.int32] | None = None
        transitions: ByteClasses | None = None
        if dfa.transitions is not None:
            classes, columns = dfa.transitions
            transitions = (
                np.ascontiguousarray(classes, dtype=np.uint8),
                np.ascontiguousarray(columns, dtype=np.int32),
            )
        else:
            table = np.ascontiguousarray(dfa.table, dtype=np.int32)
        # uninitialised: the core writes a whole row before marking it ready, and nothing reads a
        # row before that (``allowed`` and fills ensure it, ``masks`` and the cache wait for all)
        masks = _sparse_rows(accept.shape[0] + 1, vocab.words)
        c = cls(vocab, table, accept, masks, dfa.start, key, ready=False, transitions=transitions)
        c.native.ensure(c.start)
        return c

    @classmethod
    def from_compressed(cls, vocab: Vocab, g: core.Grammar, accept: NDArray[np.uint8], key: str) -> CompiledConstraint:
        """The form of ``g``, a compressed core grammar (every index checked), e.g. over a cache file's
        arrays: its large rows shared with the process's other forms."""
        rows, shared, held, accept, g = _held(vocab, g, accept)
        c = cls(vocab, None, accept, None, g.start, key, rows=rows, transitions=held, shared=shared)
        c._native = g
        return c

    @property
    def num_states(self) -> int:
        return int(self.accept.shape[0])

    @property
    def table(self) -> NDArray[np.int32]:
        """The automaton's dense table int32[S, 256]. A compressed form expands it on each read
        (1 KB per state, for a distance computation or a test; steps go through the core)."""
        if self._table is not None:
            return self._table
        assert self._transitions is not None
        classes, table = self._transitions
        return np.ascontiguousarray(class_columns(table, classes)[:, classes], dtype=np.int32)

    @property
    def transitions(self) -> ByteClasses | None:
        return self._transitions

    @property
    def native(self) -> core.Grammar:
        """The ``_core.Grammar`` over the same buffers (built once)."""
        if self._native is None:
            require_native()
            if self._rows is not None:
                assert self._transitions is not None
                classes, table = self._transitions
                row_of, off, kind, data = self._rows
                self._native = core.Grammar.compressed(
                    native_vocab(self.vocab),
                    classes,
                    table,
                    self.accept,
                    row_of,
                    off,
                    kind,
                    data,
                    self.start,
                    self._shared,
                )
            else:
                assert self._masks is not None
                held, held_classes = self._search_form()
                self._native = core.Grammar(
                    native_vocab(self.vocab), held, self.accept, self._masks, self.start, self._ready, held_classes
                )
        return self._native

    @property
    def compressed(self) -> bool:
        return self._rows is not None

    @property
    def compressed_rows(self) -> Rows | None:
        """The compressed rows with every one in place, as a cache file holds them (a copy where the
        form names shared rows: for files, tests and tools; fills go through ``native``)."""
        rows = self._rows
        return None if rows is None else unshare(rows, self._shared)

    @property
    def shared_words(self) -> tuple[NDArray[np.uint32], ...]:
        """The process-wide rows this form names (``shared_rows.py``), each the pool's one copy."""
        return tuple(words for _kind, words in self._shared)

    @property
    def private_nbytes(self) -> int:
        """``nbytes`` less the shared rows it names (``shared_rows.py``): what holding this form costs
        where other forms over the vocabulary already hold those rows."""
        compact, transitions = self._rows, self._transitions
        if compact is None or transitions is None:
            return self.nbytes
        return self._compressed_bytes(compact, transitions)

    @property
    def nbytes(self) -> int:
        """What this form holds now: the automaton and the mask rows computed so far (dense), or its
        compressed rows once complete, the shared rows it names included (the benchmarks count this;
        the in-memory cache counts ``private_nbytes`` and each of ``shared_words`` once for all forms).
        A lazy form's mask buffer is allocated whole but left untouched (the pages of rows never
        computed are never backed by memory), so only its computed rows count."""
        # read without the lock, while a compressed form may be swapped in: that sets the compressed
        # fields, then the grammar, before it clears the dense ones, so reading the dense ones and the
        # grammar first sees one form whole
        table, masks, grammar = self._table, self._masks, self._native
        compact, transitions, shared = self._rows, self._transitions, self._shared
        if compact is not None and transitions is not None:
            return self._compressed_bytes(compact, transitions) + shared_nbytes(shared)
        assert masks is not None
        rows = masks.shape[0] if self._ready else (grammar or self.native).ready_rows
        return int(self._automaton_bytes(table, transitions) + self.accept.nbytes + rows * masks.strides[0])

    def _compressed_bytes(self, compact: Rows, transitions: ByteClasses) -> int:
        return int(sum(a.nbytes for a in (*transitions, self.accept, *compact)))

    @staticmethod
    def _automaton_bytes(table: NDArray[np.int32] | None, transitions: ByteClasses | None) -> int:
        if table is not None:
            return int(table.nbytes)
        assert transitions is not None
        return int(sum(a.nbytes for a in transitions))

    @property
    def dense_bytes(self) -> int:
        """The automaton as held and every mask row, dense: what ``complete()`` on a form the
        background did not complete holds until its rows are compressed (the background completion
        never holds it). Sized from the shapes, never by expanding a table."""
        automaton = self._automaton_bytes(self._table, self._transitions)
        return int(automaton + self.accept.nbytes + (self.num_states + 1) * self.vocab.words * 4)

    def compress(self) -> CompiledConstraint:
        """Replace the complete dense rows by their compressed form (native core only). Rows a batch
        already holds keep the dense grammar until they are set again; new rows get the compressed one."""
        with self._compress_lock:
            if self._rows is not None:
                return self
            require_native()
            self._hold_compressed(self.native.compress())
        if self.on_compressed is not None:
            self.on_compressed(self)
        return self

    def adopt_compressed(self, g: core.Grammar) -> None:
        """Take ``g``, this form's rows compressed elsewhere (the background finisher compresses them
        row by row, never holding them dense), in place of the rows held now."""
        with self._compress_lock:
            if self._rows is not None:
                return
            self._hold_compressed(g)
        if self.on_compressed is not None:
            self.on_compressed(self)

    def _hold_compressed(self, g: core.Grammar) -> None:
        if g.num_states != self.num_states:
            raise ValueError("not this form's rows compressed")
        rows, shared, held, _accept, g = _held(self.vocab, g, self.accept)
        # the compressed fields before the dense ones are cleared: ``nbytes`` reads without the lock
        # (the shared rows first: a reader that sees the rows sees what they name)
        self._shared = shared
        self._rows, self._transitions = rows, held
        # in this order: readers without the lock (nbytes, mask_row) take the dense rows, then the
        # grammar; a lazy form's rows are not all computed, so `_ready` stays as it was
        self._native = g
        self._masks = None
        self._table = None

    def _search_form(self) -> tuple[NDArray[np.int16] | NDArray[np.int32] | Comb, NDArray[np.uint8] | None]:
        """(table, classes): the automaton as held, for the core and the distance searches: the class
        columns or their comb, and their classes; or the dense table and None (never expanded for them)."""
        if self._table is not None:
            return self._table, None
        assert self._transitions is not None
        classes, columns = self._transitions
        return columns, classes

    @property
    def distances(self) -> NDArray[np.int32]:
        """Per state, the fewest tokens to an accepting state (``budget.py``), computed on first use."""
        if self._distances is None:
            table, classes = self._search_form()
            self._distances = token_distances(table, self.accept, self.vocab, classes)
        return self._distances

    @distances.setter
    def distances(self, dist: NDArray[np.int32]) -> None:
        """Distances computed elsewhere for this very automaton and vocabulary (another process)."""
        self._distances = dist

    @property
    def known_distances(self) -> NDArray[np.int32] | None:
        """The exact distances if they are computed already (never computes them)."""
        return self._distances if self._distances is not None else self._exact_later

    def steering_distances(self) -> NDArray[np.int32]:
        """The distances the decode loop steers by; never waits for the exact ones. Those take a
        walk of the vocabulary per state and round (0.3 s for a 2,000-state schema over 100k
        tokens), a stall of the whole batch if computed inline at the first steered step. Until a
        background thread has them, steering uses the single-byte figure (``budget.distances``, a
        search over the automaton only): an achievable upper bound, so steering by it is safe, only
        earlier. Switching to the exact figure keeps the invariant (exact <= bound)."""
        target = self._figures()
        if target is self._bound and not self._exact_started:
            self._exact_started = True
            threading.Thread(target=self._compute_exact, name="llmserve-constraint-distances", daemon=True).start()
        return target

    def _figures(self) -> NDArray[np.int32]:
        """``steering_distances`` without starting the background search: the exact distances when
        known, else the single-byte figure (a search over the automaton, computed once). What a
        request's admission reads (``steerable_within``): a request that is never steered must not
        start a search of seconds."""
        if self._distances is None and self._exact_later is not None:
            self._distances = self._exact_later
        target: NDArray[np.int32]
        if self._distances is not None:
            target = self._distances
        else:
            if self._bound is None:
                table, classes = self._search_form()
                self._bound = byte_distances(table, self.accept, self.vocab.single_bytes, classes)
            target = self._bound
        if target is not self._steer_dist:
            self._steer_dist = target
            self._max_distance = None
            self._budget_rows.clear()
        return target

    def _compute_exact(self) -> None:
        try:
            table, classes = self._search_form()
            with _EXACT_SLOT:
                exact = token_distances(table, self.accept, self.vocab, classes)
            self._exact_later = exact
            if self.on_distances is not None:
                self.on_distances(exact)
        except Exception:  # steering goes on with the bound
            log.exception("computing the token distances of constraint %s failed", self.key[:12])

    # Budget rows kept per constraint (each is one mask row: 16 KB at a 128k vocabulary).
    BUDGET_ROWS_KEPT = 32

    def budget_row(self, state: int, k: int) -> NDArray[np.uint32] | None:
        """The tokens allowed in ``state`` after which the answer can still end within ``k`` more
        tokens (by ``steering_distances``), plus end of sequence when ``state`` accepts; None when no token
        qualifies. Each row is a walk over the whole vocabulary (up to milliseconds at 100k tokens)
        while steering keeps reaching the same few closing states, so the latest rows are kept."""
        dist = self.steering_distances()
        key = (int(state), int(k))
        if key in self._budget_rows:
            return self._budget_rows[key]
        row = np.zeros(self.vocab.words, dtype=np.uint32)
        self.native.budget_row(state, dist, k, row)
        found = row if row.any() else None
        if len(self._budget_rows) >= self.BUDGET_ROWS_KEPT:
            self._budget_rows.pop(next(iter(self._budget_rows)), None)
        self._budget_rows[key] = found
        return found

    @property
    def max_distance(self) -> int:
        """The largest finite distance: a row with more tokens left than this needs no steering.
        ``UNREACHABLE - 1`` when some state has none (a vocabulary without some single bytes): a
        walk left unsteered could reach it, so every step is steered. Read for every budgeted row at
        every step, so computed once per ``steering_distances``."""
        d = self.steering_distances()
        if self._max_distance is None:
            finite = d[d != UNREACHABLE]
            if finite.size < d.size:
                self._max_distance = int(UNREACHABLE) - 1
            else:
                self._max_distance = int(finite.max()) if finite.size else 0
        return self._max_distance

    def steering_bound(self, state: int | None = None) -> int:
        """The figure steering reads now (``steering_distances``) for ``state`` (default the start)."""
        return int(self._figures()[self.start if state is None else state])

    def shortest_from(self, state: int) -> bytes | None:
        """One shortest answer in bytes from ``state`` (None: none, or no native core)."""
        if core is None:
            return None
        table, classes = self._search_form()
        return core.shortest_answer(native_vocab(self.vocab), table, self.accept, int(state), classes)

    def add_answer(self, answer: bytes, state: int | None = None) -> int:
        """Steer by ``answer`` from ``state`` (default the start), cut into the longest tokens, too:
        until the exact distances are there (each already at most any answer's tokens), the states
        where its tokens start get at most the tokens left of it in the single-byte figure steering
        reads. Its tokens; -1 when it is not an answer from there (or no native core)."""
        if core is None:
            return -1
        table, classes = self._search_form()
        s = self.start if state is None else int(state)
        path = core.token_path(native_vocab(self.vocab), table, self.accept, s, answer, classes)
        if path is None:
            return -1
        tokens = len(path) - 1
        dist = self._figures()
        if self._distances is None:  # the bound, this form's own array
            np.minimum.at(dist, path[:-1], np.arange(tokens, 0, -1, dtype=np.int32))
            self._max_distance = None
            self._budget_rows.clear()
        return tokens

    def steerable_within(self, tokens: int, output: Iterable[int] = ()) -> bool:
        """Whether steering can end an answer within ``tokens`` more tokens after ``output`` (its
        tokens so far), recording one shortest answer from there if the figure does not fit
        (``budget.steerable_from``). Not the exact figure: see ``compiler.serving_form``."""
        state = self.walk(output)
        return state < 0 or steerable_from(self, state, tokens)

    @property
    def masks(self) -> NDArray[np.uint32]:
        """Every state's mask row, dense (waits for lazily computed rows). A compressed form expands
        a fresh copy on every call (tests and benchmarks; fills read the compressed rows)."""
        self.complete()
        if self._masks is not None:
            return self._masks
        out = np.empty((self.num_states + 1, self.vocab.words), dtype=np.uint32)
        self.native.rows_into(out)
        return out

    def complete(self) -> CompiledConstraint:
        """Compute every mask row not computed yet and compress them (and the automaton); wait for
        the background cache writer if any."""
        if not self.wait_completed() and not self._ready:  # the background did not compress it
            self.native.complete()
            self._ready = True
            self.compress()
        return self

    def wait_completed(self, timeout: float | None = None) -> bool:
        """Wait for the background completion, if one was queued in this process, and say whether the
        form is compressed now: False where none was queued, where it stays lazy (its compressed rows
        pass ``complete_max_mb``) or past ``timeout``. Computes nothing itself (``complete`` does)."""
        finished = self._finished
        if finished is not None and threading.current_thread() is not finished.thread and finished.pid == os.getpid():
            finished.done.wait(timeout)
        return self.compressed

    def completed_by(self, thread: threading.Thread) -> Completion:
        """``thread`` will complete this constraint: ``complete()`` on any other thread waits for it."""
        self._finished = Completion(thread)
        return self._finished

    def step(self, state: int, token: int) -> int:
        """Next state after ``token`` (-1: the token was not allowed)."""
        if self._table is None:
            return self.native.step(state, token)
        return reference.step(self.vocab, self._table, self.accept, state, token)

    def walk(self, tokens: Iterable[int], state: int | None = None) -> int:
        s = self.start if state is None else state
        for t in tokens:
            s = self.step(s, t)
        return s

    def mask_row(self, state: int) -> NDArray[np.uint32]:
        """The packed mask row uint32[W] of ``state`` (-1: the dead row), computed first if missing."""
        r = state if state >= 0 else self.num_states
        masks = self._masks  # compression may drop it meanwhile; this reference keeps it
        if masks is not None and self._ready:
            return masks[r]
        # the grammar read after `masks`: the lazy one over them, or a compressed one swapped in since,
        # which holds every row while `masks` may lack this one
        grammar = self._native if masks is not None else None
        if masks is not None and grammar is not None and grammar.compressed_rows is None:
            grammar.ensure(state)
            return masks[r]
        row = np.empty((1, self.vocab.words), dtype=np.uint32)
        (grammar or self.native).rows_into(row, r)
        return row[0]

    def allowed(self, state: int) -> NDArray[np.bool_]:
        """Boolean [vocab.size] of the tokens allowed in ``state``."""
        bits = np.unpackbits(self.mask_row(state).view(np.uint8), bitorder="little")
        return bits[: self.vocab.size].astype(bool)

    def is_accepting(self, state: int) -> bool:
        return state >= 0 and bool(self.accept[state])


def compile_dfa(dfa: ByteDFA, vocab: Vocab, *, backend: str = "native", key: str = "") -> CompiledConstraint:
    """Every mask row now (no memo, no disk cache: ``compiler.compile_constraint`` adds those)."""
    table = np.ascontiguousarray(dfa.table, dtype=np.int32)
    accept = np.ascontiguousarray(dfa.accept, dtype=np.uint8)
    if backend == "native":
        require_native()
        masks = core.compile_masks(native_vocab(vocab), table, accept)
        return CompiledConstraint(vocab, table, accept, masks, dfa.start, key).compress()
    if backend == "python":
        masks = reference.compile_masks(vocab, table, accept)
        return CompiledConstraint(vocab, table, accept, masks, dfa.start, key)
    raise ValueError(f"backend must be native or python, not {backend!r}")
