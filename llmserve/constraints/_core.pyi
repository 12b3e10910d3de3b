# Typed interface of the native constraint core, the module csrc/bindings.cpp and csrc/tree_bindings.cpp
# build (C++ in csrc/).
#
# Shapes and dtypes (every array C-contiguous in its last dimension; the bindings check dtypes,
# shapes, lengths, row indices and state ids, and raise ValueError (TypeError for an object of the
# wrong class) rather than touch memory they do not own):
#   vocabulary  offsets int64[size + 1], data uint8: token i = data[offsets[i]:offsets[i + 1]]
#               (an empty token is never allowed); W = (size + 31) // 32 uint32 words per mask row
#   DFA         table int32[S, 256] (-1: dead), accept uint8[S], start state in [0, S); or over byte
#               classes: classes uint8[256] and table int32[S, C], next state on byte b table[s, classes[b]],
#               or a comb of those columns, (base int32[S], slots [N, 2] of (owner, next)): next state
#               slots[base[s] + classes[b], 1] where its owner is s, else -1 (csrc/comb.h)
#   masks       uint32[S + 1, W]: row s = tokens allowed in state s, row S = the dead row (end of
#               sequence only); bit (t % 32) of word (t // 32) set = token t allowed
#   batch       bitmask uint32[B, W'] (W' >= ceil(V / 32)), logits float32[B, V] (rows may be strided),
#               active uint8[B] (1: the row is constrained)
#
# GIL: the calls marked "releases the GIL" run on the core's native thread pool without it; the
# others hold it (they are O(1) or read Python objects).

from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import numpy as np
from numpy.typing import NDArray

# an automaton's table: dense int32[S, 256], or one column per byte class, int32[S, C] or, where S
# <= 32,767, int16; or a comb of the class columns (a compressed grammar's: base int32[S], slots
# [N, 2] in int16 where S <= 32,767, else int32; csrc/vocab_trie.h, Transitions, and csrc/comb.h)
Comb = tuple[NDArray[np.int32], NDArray[np.int16] | NDArray[np.int32]]
Columns = NDArray[np.int32] | NDArray[np.int16] | Comb

def default_threads() -> int:
    """LLMSERVE_CONSTRAINT_THREADS when set, else the hardware threads (at most 16)."""

def pool_size() -> int:
    """Threads of the native pool (the calling thread included)."""

def pool_dispatches() -> int:
    """Calls that went to the pool's workers since it started (a call on one thread runs inline and
    does not count). For tests and diagnostics."""

def pool_wakeups() -> int:
    """Pooled calls that had to wake a sleeping worker (a system call) since the pool started."""

def pool_spin_joins() -> int:
    """Jobs a worker joined while spinning after an earlier one, without being woken."""

def pool_spinning() -> int:
    """Workers spinning for the next job now."""

def pool_sleeping() -> int:
    """Workers asleep now."""

def spin_us() -> int:
    """How long a worker spins for the next job after one before it sleeps (microseconds)."""

def set_spin_us(us: int) -> int:
    """Set ``spin_us`` (0: never spin; < 0: the default, 200); returns the previous value."""

def pool_spin_backoffs() -> int:
    """Times the pool saw one of its threads lose its CPU and stopped spinning for a while."""

def spin_backoff_us() -> int:
    """How long the pool stops spinning after one of its threads lost its CPU (microseconds)."""

def set_spin_backoff_us(us: int) -> int:
    """Set ``spin_backoff_us`` (0: never stop spinning; < 0: the default, 50,000); returns the previous
    value."""

def min_bytes_per_thread() -> int:
    """Bytes (read and written) each thread must get before a fill/apply is split over the pool."""

def set_min_bytes_per_thread(bytes: int) -> int:
    """Set ``min_bytes_per_thread`` (<= 0: the default, 2 MiB); returns the previous value."""

class Vocab:
    """A vocabulary as bytes, with the token trie mask rows are computed over."""

    def __init__(self, offsets: NDArray[np.int64], data: NDArray[np.uint8], eos: Sequence[int], size: int) -> None:
        """offsets int64[size + 1], data uint8[N]; eos ids in [0, size). Copies both; builds the trie
        with the GIL released."""
    @property
    def size(self) -> int: ...
    @property
    def words(self) -> int:
        """uint32 words per mask row: (size + 31) // 32."""
    def longest_cut(self, data: bytes) -> int:
        """The tokens of ``data`` cut into the longest token at each step (an upper bound of the
        fewest); -1 when some byte starts no token. Releases the GIL."""

def compile_masks(
    vocab: Vocab, table: NDArray[np.int32], accept: NDArray[np.uint8], nthreads: int = 0
) -> NDArray[np.uint32]:
    """Every mask row at once: table int32[S, 256], accept uint8[S] -> masks uint32[S + 1, W].
    Releases the GIL. nthreads 0: the whole pool."""

def compact_rows(
    masks: NDArray[np.uint32], nthreads: int = 0
) -> tuple[NDArray[np.int32], NDArray[np.int64], NDArray[np.uint8], NDArray[np.uint32]]:
    """masks uint32[N, W] -> (row_of int32[N], off int64[R + 1], kind uint8[R], data uint32[off[R]]):
    each distinct row once, as its partial words, allowed ids or refused ids, whichever is smallest
    (layout in csrc/grammar.h). Releases the GIL."""

class Grammar:
    """A DFA compiled against a vocabulary, over buffers the caller owns (kept alive by this object).
    ready=False: only the dead row is computed now; the others on first use (``ensure``, batch fills)
    or by ``complete``; ``masks`` must then be writable."""

    def __init__(
        self,
        vocab: Vocab,
        table: Columns,
        accept: NDArray[np.uint8],
        masks: NDArray[np.uint32],
        start: int = 0,
        ready: bool = True,
        classes: NDArray[np.uint8] | None = None,
    ) -> None:
        """table int32[S, 256] (or class columns or their comb with its ``classes``), accept uint8[S],
        masks uint32[S + 1, vocab.words]."""
    @staticmethod
    def over_lazy(vocab: Vocab, lazy: LazyDfa) -> Grammar:
        """A grammar over an automaton built as it is walked (the states its steps and rows build
        are ``lazy``'s): rows computed on first use, ``num_states`` the automaton's state limit
        (row ``num_states``: the dead row). A step or row past the automaton's limits ends the
        answer (the dead state). ``compress``, ``rows_into``, ``budget_row``, ``token_distances``,
        ``complete`` and ``finish_later`` refuse it (they need the whole automaton)."""
    @staticmethod
    def compressed(
        vocab: Vocab,
        classes: NDArray[np.uint8],
        table: Columns,
        accept: NDArray[np.uint8],
        row_of: NDArray[np.int32],
        off: NDArray[np.int64],
        kind: NDArray[np.uint8],
        data: NDArray[np.uint32],
        start: int = 0,
        shared: tuple[tuple[int, NDArray[np.uint32]], ...] = (),
    ) -> Grammar:
        """A complete grammar over compressed rows (``compact_rows``'s arrays, kept alive by it) and a
        compressed automaton: byte classes uint8[256] and their columns, or (as the core makes them)
        their comb. A row of kind 5 is ``shared[k]`` (its one word k): a (kind, words) pair of kind 0
        or 3, held once for many grammars (``shared_rows.py``). ValueError when an index in them is
        out of range."""
    @property
    def shared_rows(self) -> tuple[tuple[int, NDArray[np.uint32]], ...] | None:
        """The shared rows a compressed grammar's kind-5 rows name; None for a dense one."""
    @property
    def compressed_rows(
        self,
    ) -> tuple[NDArray[np.int32], NDArray[np.int64], NDArray[np.uint8], NDArray[np.uint32]] | None:
        """(row_of, off, kind, data) of a compressed grammar; None for a dense one."""
    @property
    def transitions(self) -> tuple[NDArray[np.uint8], Columns] | None:
        """(classes, table) of a compressed grammar: its columns packed as a comb, (base, slots), as
        compress() and the background completion make it (or the columns it was given); read-only
        arrays where the core made them. None for a dense one."""
    def compress(self, nthreads: int = 0) -> Grammar:
        """A compressed copy of this complete grammar (rows and automaton; same state ids). Releases the GIL.
        ValueError: a row is not computed yet."""
    def compact_all(self, max_bytes: int = ...) -> Grammar | None:
        """A compressed copy made row by row on this thread, as the background completion makes it: ready
        rows are read, the others computed into a scratch row and left missing here (the dense table is
        never held). The same arrays as compress(); None once they pass max_bytes. Releases the GIL.
        ValueError: a grammar over a lazy automaton."""
    def rows_into(self, out: NDArray[np.uint32], first: int = 0) -> None:
        """out[i] = mask row first + i, dense, computed first if missing. Releases the GIL."""
    def ensure(self, state: int) -> None:
        """Compute the mask row of ``state`` (-1: the dead row) if it is not ready yet. Releases the GIL.
        ValueError: a state past S."""
    def complete(self, nthreads: int = 0) -> None:
        """Compute every missing mask row (nthreads=1: on this thread only). Releases the GIL."""
    @property
    def ready_rows(self) -> int:
        """Mask rows computed so far (S + 1 when complete)."""
    def finish_later(self, id: int, max_bytes: int) -> None:
        """Queue the grammar for completion, compressed, by finished_next(); the caller keeps its buffers
        alive until then. ValueError: a compressed grammar, or max_bytes <= 0."""
    def step(self, state: int, token: int, /) -> int:
        """Next state after ``token`` (-1: not allowed, or ``state`` was already -1). ValueError: a
        state outside [-1, S)."""
    def walk(self, state: int, tokens: Sequence[int], /) -> int:
        """``step`` over ``tokens`` from ``state``."""
    def budget_row(self, state: int, dist: NDArray[np.int32], k: int, out: NDArray[np.uint32]) -> None:
        """``out`` [W] = the tokens allowed in ``state`` that end in a state q with ``dist[q] <= k``,
        and end of sequence when ``state`` accepts."""
    def token_distances(self, dist: NDArray[np.int32], order: NDArray[np.int32]) -> int:
        """Lower ``dist`` [S] in place to the fewest tokens to an accepting state; returns the rounds."""
    @property
    def num_states(self) -> int:
        """S."""
    @property
    def start(self) -> int: ...

def token_distances(
    vocab: Vocab,
    table: Columns,
    accept: NDArray[np.uint8],
    dist: NDArray[np.int32],
    order: NDArray[np.int32],
    classes: NDArray[np.uint8] | None = None,
) -> int:
    """``Grammar.token_distances`` from the automaton alone: reads no mask row, so a budget check
    needs no compiled mask tables. Releases the GIL."""

def fewest_tokens(
    vocab: Vocab,
    table: Columns,
    accept: NDArray[np.uint8],
    start: int,
    classes: NDArray[np.uint8] | None = None,
    budget_ms: int = 0,
) -> tuple[int, int]:
    """(tokens, explored): the fewest tokens from ``start`` to an accepting state (2**31 - 1: none),
    searched breadth-first from ``start`` over token steps, so it costs the states nearer the start
    than the shortest answer. tokens is -1 when ``budget_ms`` (> 0) ran out first: every answer then
    takes more than ``explored`` tokens. Releases the GIL."""

def pack_comb(columns: NDArray[np.int32]) -> Comb:
    """Class columns int32[S, C] packed as the comb a compressed grammar holds (csrc/comb.h): every
    state at the lowest base where its moves land on free slots. Releases the GIL."""

def byte_distances(
    table: Columns,
    accept: NDArray[np.uint8],
    usable: NDArray[np.uint8],
    classes: NDArray[np.uint8] | None = None,
) -> NDArray[np.int32]:
    """int32[S]: per state, the fewest steps over the bytes with ``usable[b]`` (uint8[256]) to an
    accepting state (2**31 - 1: none). Releases the GIL."""

def tree_facts(
    ast: NDArray[np.int32], usable: NDArray[np.uint8], cap: int, budget_ms: int = 0
) -> tuple[int, int, bytes | None]:
    """(states, moves, answer) of the NFA ``LazyDfa`` would build from ``ast``, found without
    building it (csrc/tree_facts.h): its states and moves (epsilon and byte) exactly; ``answer``:
    one shortest string over the bytes with ``usable[b]`` (uint8[256]), None when there is none.
    Past ``cap`` states the walk stops: states = cap + 1, moves 0, answer None. ValueError: a
    malformed AST, or ``budget_ms`` (> 0) ran out. Releases the GIL."""

def greedy_tokens(
    vocab: Vocab,
    table: Columns,
    accept: NDArray[np.uint8],
    start: int,
    classes: NDArray[np.uint8] | None = None,
) -> int:
    """The tokens of one answer from ``start``, an upper bound of the fewest at about the cost of a
    search over bytes: a shortest answer in bytes cut into the longest token at each point. 2**31 - 1:
    no answer; -1: a byte of it starts no token. Releases the GIL."""

def shortest_answer(
    vocab: Vocab,
    table: Columns,
    accept: NDArray[np.uint8],
    start: int,
    classes: NDArray[np.uint8] | None = None,
) -> bytes | None:
    """The bytes of one shortest answer from ``start`` (what ``greedy_tokens`` cuts): over the bytes
    that are tokens by themselves where those reach acceptance, else over any bytes; None: no
    answer. Releases the GIL."""

def token_path(
    vocab: Vocab,
    table: Columns,
    accept: NDArray[np.uint8],
    start: int,
    answer: bytes,
    classes: NDArray[np.uint8] | None = None,
) -> NDArray[np.int32] | None:
    """The states where the tokens of ``answer`` (cut into the longest tokens) start, walked from
    ``start``, then the state it ends in (int32[tokens + 1]); None when a byte starts no token, the
    walk leaves the automaton or its end does not accept. Releases the GIL."""

class Batch:
    """The engine's persistent batch: per row a grammar (or None: unconstrained), its DFA state, and a
    reference to the engine's output-token list of that row (read by ``sync``, never copied)."""

    def __init__(self, vocab: Vocab, /) -> None: ...
    def set_row(self, index: int, grammar: Grammar | None, tokens: list[int] | None) -> None:
        """Row ``index`` starts at the grammar's start state; ``tokens`` grows in place as the engine decodes."""
    def clear_row(self, index: int, /) -> None: ...
    def move(self, src: int, dst: int) -> None:
        """Row ``src`` to ``dst`` (``src`` becomes unconstrained)."""
    def swap(self, a: int, b: int, /) -> None: ...
    def sync(self, n: int) -> int:
        """Advance the first ``n`` rows' states over the tokens appended to their lists since the last
        sync; a list that shrank or diverged is replayed from the start. Holds the GIL (it reads the
        lists). Returns how many rows were replayed from the start."""
    def fill(
        self, out: NDArray[np.uint32], active: NDArray[np.uint8] | None = None, n: int = -1, nthreads: int = 0
    ) -> None:
        """out uint32[B, W'] (C-contiguous): the first n rows (-1: B) get their state's mask row,
        unconstrained rows all ones; active uint8[>= n] gets 1 per constrained row. Computes the lazy rows
        it needs. Releases the GIL. Threads: at most ``nthreads`` (0: the pool), fewer for a small
        batch (see ``min_bytes_per_thread``); one thread runs inline."""
    def fill_apply(self, logits: NDArray[np.float32], out: NDArray[np.uint32] | None = None, nthreads: int = 0) -> None:
        """logits float32[B, V], in place: disallowed tokens become -inf, in one pass; out uint32[B, W']
        (optional) gets the bitmask too. Releases the GIL. Threads as for ``fill``."""
    def row(self, index: int, /) -> tuple[int | None, int]:
        """(state, tokens consumed); (None, 0) for an unconstrained row."""
    @property
    def capacity(self) -> int:
        """Rows allocated so far."""

def finished_next() -> int:
    """Wait (without the GIL) for a queued grammar, compress all its rows on this thread (computing those
    not computed yet one at a time, never all of them dense), return its id."""

def finished_take(id: int, grammar: Grammar | None) -> Grammar | None:
    """The compressed grammar finished_next() made of ``grammar`` (queued as ``id``), or None when its
    compressed rows passed the max_bytes it was queued with (it stays lazy). Taken once; ``grammar=None``
    drops the result."""

@overload
def build_dfa(
    ast: NDArray[np.int32],
    max_states: int,
    max_nfa_states: int,
    budget_ms: int = 0,
    budget_bytes: int = 0,
    classes: Literal[False] = False,
) -> tuple[NDArray[np.int32], NDArray[np.uint8]]: ...
@overload
def build_dfa(
    ast: NDArray[np.int32],
    max_states: int,
    max_nfa_states: int,
    budget_ms: int = 0,
    budget_bytes: int = 0,
    *,
    classes: Literal[True],
) -> tuple[NDArray[np.uint8], NDArray[np.int32], NDArray[np.uint8]]: ...
@overload
def build_dfa(
    ast: NDArray[np.int32],
    max_states: int,
    max_nfa_states: int,
    budget_ms: int = 0,
    budget_bytes: int = 0,
    classes: bool = False,
) -> tuple[NDArray, ...]:
    """Regular-expression AST (int32[N], serialised as in csrc/dfa.h) -> minimal byte DFA
    (table int32[S, 256], accept uint8[S]; with ``classes``: (classes uint8[256], table int32[S, C],
    accept uint8[S]), C the byte classes the construction used, no byte table built). Releases the GIL. ValueError: too many states, a
    language with no string, a malformed AST (or one nested deeper than 2000), or a budget exceeded
    ("constraint compile time budget (N ms) exceeded" after ``budget_ms``; "... memory budget ..."
    past ``budget_bytes`` of construction memory; 0: no limit)."""

class LazyDfa:
    """A byte DFA whose states are built as walks reach them (csrc/lazy_dfa.h): the NFA is built
    here (within ``budget_ms``; ValueError as ``build_dfa`` for a malformed or empty language, or an
    NFA over ``max_nfa_states``), states later, numbered as found (start 0), not minimal, each one
    reaching acceptance. Calls that build states raise ValueError past ``max_states`` states,
    ``budget_bytes`` of memory (the NFA's included) or ``call_ms`` within one call (0: no limit).
    Thread-safe (one call at a time); releases the GIL. Not to be used in a process forked while
    another thread used it (its lock may be held there forever)."""

    def __init__(
        self,
        ast: NDArray[np.int32],
        max_states: int,
        max_nfa_states: int,
        budget_ms: int = 0,
        budget_bytes: int = 0,
        call_ms: int = 0,
    ) -> None: ...
    def walk(self, data: bytes, state: int = 0) -> int:
        """The state after ``data`` from ``state`` (-1: dead)."""
    def mask_row(self, vocab: Vocab, state: int, out: NDArray[np.uint32]) -> None:
        """Write the packed mask row of ``state`` into ``out`` (uint32[vocab.words]), as a Grammar
        computes a row (end-of-sequence rule included)."""
    def byte_distance(self, state: int, usable: NDArray[np.uint8]) -> int:
        """The fewest bytes from ``state`` to acceptance over the bytes b with ``usable[b]``
        (uint8[256]), as ``byte_distances`` gives for the whole automaton; 2**31 - 1: none. Read off
        the NFA: builds no state."""
    def max_byte_distance(self, usable: NDArray[np.uint8]) -> int:
        """An upper bound, not the exact maximum, of ``byte_distance(q, usable)`` over every state q
        this automaton can build whose distance is finite (0: none is): the largest finite distance of
        an NFA state, which needs no state built. A state's distance is the least of its NFA states',
        so far ones that always come with a near one (``[ab]*|a{50}``) leave the real maximum below it."""
    def steering_distance(self, state: int, usable: NDArray[np.uint8]) -> int:
        """What ``budget_row`` steers by: the least of ``byte_distance(state, usable)`` and the
        tokens left of an answer recorded through ``state`` (``add_answer``). Builds no state."""
    def max_steering_distance(self, usable: NDArray[np.uint8]) -> int:
        """An upper bound of every finite ``steering_distance(q, usable)``: ``max_byte_distance``, or
        the most tokens of a recorded answer when that is more; 2**31 - 2 when a state a walk may
        reach can have no finite figure (some single bytes are not tokens): steer every step.
        Builds no state."""
    def add_answer(self, vocab: Vocab, state: int, answer: bytes) -> int:
        """Record ``answer`` (cut into the longest tokens) as an answer from ``state`` for steering:
        every state where one of its tokens starts can end within the tokens left of it. Its tokens;
        -1 when it is not an answer from ``state`` (nothing recorded). Builds the states along it."""
    def occurs(self, texts: list[bytes], max_steps: int) -> list[int]:
        """Per text, whether it occurs inside some answer (a factor of a string of the language): 1 yes,
        0 no, -1 not decided within ``max_steps`` NFA moves read in all. Builds no state."""
    def shortest_answer(self, vocab: Vocab, state: int = 0) -> bytes | None:
        """The bytes of one shortest answer from ``state`` (what ``greedy_tokens`` cuts); None: no
        answer. Builds the states along it."""
    def budget_row(self, vocab: Vocab, state: int, usable: NDArray[np.uint8], k: int, out: NDArray[np.uint32]) -> None:
        """``Grammar.budget_row`` for this automaton with ``dist = steering_distance(..., usable)``:
        out (uint32[vocab.words]) = the tokens whose bytes walk from ``state`` to a state that can
        end within ``k`` tokens, plus end of sequence when ``state`` accepts. Builds the states the walk
        reaches. Each state's distance is kept for the latest ``usable`` (a row asks for one per trie
        node where tokens end, mostly the same few states), so pass the same set every time."""
    def fewest_tokens(self, vocab: Vocab, state: int = 0, budget_ms: int = 0) -> tuple[int, int]:
        """As ``fewest_tokens`` over the whole automaton (the same result), building the states the
        search reaches; (-1, 0) when the automaton's ``call_ms`` runs out first."""
    def greedy_tokens(self, vocab: Vocab, state: int = 0) -> int:
        """As ``greedy_tokens`` over the whole automaton: the tokens of one answer from ``state`` (a
        shortest one in bytes, over single-byte tokens where they reach acceptance, cut into the
        longest token at each point), an upper bound of the fewest; 2**31 - 1: none; -1: a byte of
        it starts no token. Builds the states along that answer."""
    def accepting(self, state: int) -> bool: ...
    @property
    def found(self) -> int:
        """States numbered so far."""
    @property
    def expanded(self) -> int:
        """States whose moves are built."""
    @property
    def letters(self) -> int:
        """Byte classes of the NFA's edges (a row's width)."""
    @property
    def exhausted(self) -> bool:
        """A state could not be built within a limit (states, memory, or one call's time): a grammar
        over this automaton has ended the answers that reached it (its row or step is dead), so new
        answers need a new automaton."""
    @property
    def full(self) -> bool:
        """A state could not be built for the state or memory limit: no later call builds one either
        (past one call's time alone, a later call, timed afresh, may)."""
    @property
    def nfa_size(self) -> tuple[int, int]:
        """(states, moves) of its NFA: epsilon moves and byte edges together."""
    @property
    def nbytes(self) -> int:
        """Memory charged to the automaton's budget: its NFA and the states built so far."""

def checksum(data: object, seed: int = 0) -> int:
    """64-bit checksum of a C-contiguous buffer (definition in csrc/checksum.h; the cache files'
    check). Releases the GIL. ValueError: a strided buffer."""

def apply_bitmask(
    logits: NDArray[np.float32], bitmask: NDArray[np.uint32], active: NDArray[np.uint8] | None = None, nthreads: int = 0
) -> None:
    """logits float32[B, V] in place: tokens whose bit in bitmask uint32[>= B, W'] is clear become -inf
    (only rows with active[r] set, when given). Releases the GIL. Threads as for ``Batch.fill``."""

class TreeSizes:
    """``tree_expanded_size``'s memo across calls: sizes by node, holding the nodes it counted."""
    def __init__(self) -> None: ...
    def __len__(self) -> int: ...

def tree_expanded_size(node: tuple, cap: int, sizes: TreeSizes | None = None) -> int:
    """``regex.expanded_size`` of a converter tree (the same counts, capped at cap + 1; csrc/tree_bindings.cpp).
    ValueError: a malformed node."""

def tree_words(node: tuple, dfa_words: Callable[[Any], NDArray[np.int32]]) -> NDArray[np.int32]:
    """``regex.serialize_ast`` of a converter tree; an embedded automaton's words are
    ``dfa_words(automaton)``. ValueError: a malformed node; OverflowError: a count past int32."""

def intersect_dfas(
    tables: Sequence[NDArray[np.int32]],
    accepts: Sequence[NDArray[np.uint8]],
    starts: Sequence[int],
    max_product_states: int,
    budget_ms: int = 0,
    budget_bytes: int = 0,
    classes: bool = False,
) -> tuple[NDArray, ...]:
    """Byte DFAs (tables int32[S_i, 256], C-contiguous; accepts uint8[S_i]; starts) -> the minimal DFA of
    the strings every one accepts, as ``build_dfa`` returns it (csrc/dfa.h ``intersect``). Releases the
    GIL. ValueError: past ``max_product_states`` product states or a budget, or no string accepted by all."""
