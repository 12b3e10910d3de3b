"""Issue #17 item 4: complete mask rows are held compressed (each distinct row once, as its partial
words, allowed ids, refused ids or dense words; csrc/grammar.h), and the automaton as byte classes
(csrc/vocab_trie.h). A compressed form must give bit for bit the masks, steps, fills and applied
logits of the dense form, on random rows, random automata and the benchmark's constraints, and what
the caches count must be what it holds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_equivalence import SETTINGS, regexes, vocabs
from transformers import AutoTokenizer

from llmserve.constraints import Vocab, budget, compile_constraint, disk_cache, load_cached, reference
from llmserve.constraints import compiler as compiler_mod
from llmserve.constraints.comb import Comb
from llmserve.constraints.compiled import compile_dfa
from llmserve.constraints.native import native, native_vocab, require_native
from llmserve.constraints.regex import compile_regex

require_native()  # the core is built wherever these tests run (make setup): a missing one fails them, never skips

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "constraints"


@pytest.fixture(scope="module")
def wide_vocab(tiny_model_dir):
    """The tiny model's tokens in a 100k-wide row: 3,125 words, four apply chunks of 1,024 words."""
    v = Vocab.from_hf_tokenizer(AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    return Vocab(list(v.tokens), v.eos_ids, 100_000)


def bench_constraints() -> dict[str, dict]:
    """memory.py's constraints: bench.py's four, the 12-property order schema, the 200-way choice."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("memory_bench", BENCH / "memory.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.constraints()
    finally:
        sys.path.remove(str(BENCH))


def dense_grammar(vocab: Vocab, table, accept, masks, start=0):
    return native.Grammar(native_vocab(vocab), table, accept, masks, start, True)


def random_rows(rng: np.random.Generator, n: int, W: int) -> np.ndarray:
    """Rows like real ones: all refused, all allowed, a few ids, all but a few, runs of whole words
    with a few partial ones, repeats of each other, mostly partial words, and near repeats (an
    earlier row with a few words changed, as strings at different depths of a JSON value are)."""
    rows = np.zeros((n, W), np.uint32)
    partial: list[int] = []
    for i in range(n):
        k = min(7, int(rng.integers(0, 10)))
        if k == 1:
            rows[i] = 0xFFFFFFFF
        elif k in (2, 3):
            ids = rng.integers(0, 32 * W, size=int(rng.integers(0, 9)))
            bits = np.zeros(32 * W, bool)
            bits[ids] = True
            rows[i] = np.packbits(bits if k == 2 else ~bits, bitorder="little").view(np.uint32)
        elif k == 4:
            rows[i] = np.where(rng.random(W) < 0.5, 0, 0xFFFFFFFF).astype(np.uint32)
            rows[i, rng.integers(0, W, size=3)] = rng.integers(0, 2**32, size=3, dtype=np.uint64).astype(np.uint32)
        elif k == 5 and i > 0:
            rows[i] = rows[rng.integers(0, i)]
        elif k == 6:
            rows[i] = rng.integers(0, 2**32, size=W, dtype=np.uint64).astype(np.uint32)
            partial.append(i)
        elif k == 7 and i > 0:
            rows[i] = rows[partial[int(rng.integers(0, len(partial)))] if partial else rng.integers(0, i)]
            changed = rng.integers(0, W, size=int(rng.integers(1, 1 + max(1, W // 40))))
            rows[i, changed] = rng.integers(0, 2**32, size=changed.size, dtype=np.uint64).astype(np.uint32)
    return rows


@pytest.mark.parametrize("seed", range(30))
def test_random_rows_expand_to_themselves(seed):
    rng = np.random.default_rng(seed)
    W = int(rng.choice([1, 2, 31, 32, 33, 64, 1025, 2100]))
    S = int(rng.integers(1, 12))
    rows = random_rows(rng, S + 1, W)
    row_of, off, kind, data = native.compact_rows(rows)
    assert len(kind) == len({r.tobytes() for r in rows})  # each distinct row once
    vocab = Vocab([bytes([i % 256]) for i in range(32 * W - 5)], (0,), 32 * W - 5)
    classes, table = np.zeros(256, np.uint8), np.full((S, 1), -1, np.int32)
    accept = np.zeros(S, np.uint8)
    g = native.Grammar.compressed(native_vocab(vocab), classes, table, accept, row_of, off, kind, data)
    back = np.empty_like(rows)
    g.rows_into(back)
    np.testing.assert_array_equal(back, rows)
    # a distinct row never takes more than its dense words
    assert off[-1] <= len(kind) * W


DELTA = 4  # csrc/grammar.h, CompactRows::kDelta


def test_near_repeats_are_held_as_deltas_of_a_base():
    """A large row repeated with a few words changed costs those words, not another large row; a
    delta's base is an earlier row of another kind (one level of expansion), and bases are
    searched for the nearest, not the first."""
    rng = np.random.default_rng(5)
    W = 3125
    base_a = rng.integers(0, 2**32, size=W, dtype=np.uint64).astype(np.uint32)
    base_b = rng.integers(0, 2**32, size=W, dtype=np.uint64).astype(np.uint32)
    near_b = base_b.copy()
    near_b[[3, 1500, 3124]] = 7
    near_b2 = base_b.copy()
    near_b2[:100] = 0  # far enough from base_b in bytes, near in words: 100 words differ
    far = base_a.copy()
    far[: W // 2] = base_b[: W // 2]  # half of each: no delta pays
    rows = np.stack([base_a, base_b, near_b, near_b2, far])
    row_of, off, kind, data = native.compact_rows(rows)
    assert kind.tolist() == [3, 3, DELTA, DELTA, 3]
    assert data[off[2]] == 1 and data[off[2] + 1] == 3  # base_b's row, three words
    assert data[off[2] + 2 : off[2] + 5].tolist() == [3, 1500, 3124]
    assert off[3] - off[2] == 2 + 2 * 3 and off[4] - off[3] == 2 + 2 * 100
    vocab = Vocab([bytes([i % 256]) for i in range(32 * W)], (0,), 32 * W)
    g = native.Grammar.compressed(
        native_vocab(vocab),
        np.zeros(256, np.uint8),
        np.full((4, 1), -1, np.int32),
        np.zeros(4, np.uint8),
        row_of,
        off,
        kind,
        data,
    )
    back = np.empty_like(rows)
    g.rows_into(back)
    np.testing.assert_array_equal(back, rows)


@pytest.fixture(scope="module")
def json_vocab():
    """60,000 tokens of 2-6 bytes drawn over letters, digits and JSON's punctuation, and every single
    byte: string rows mostly allowed but for the tokens with a quote or a backslash, as in a real
    vocabulary (the tiny model's few tokens leave every row short)."""
    rng = np.random.default_rng(3)
    alphabet = np.frombuffer(b'abcdefghijklmnopqrstuvwxyz0123456789 "]},:[{\\.-', np.uint8)
    tokens = {bytes([i]): None for i in range(256)}
    while len(tokens) < 60_000:
        tokens[bytes(rng.choice(alphabet, size=int(rng.integers(2, 7))))] = None
    return Vocab([*tokens, b""], (60_000,), 60_001)


def test_free_json_values_are_held_in_deltas(json_vocab, tmp_path):
    """{"type": "array"} (any JSON values, depth-bounded): its string rows at each depth differ only
    in the tokens that close them, held as deltas of one (at cl100k_base 717 KB -> 210 KB, where
    xgrammar holds 161 KB), with the same masks, fills and applied logits as the dense rows."""
    compiler_mod._MEMORY.clear()
    spec = {"json_schema": {"type": "array"}}
    c = compile_constraint(spec, json_vocab, cache_dir=tmp_path).complete()
    assert c.compressed
    _row_of, off, kind, data = c.compressed_rows
    deltas = np.flatnonzero(kind == DELTA)
    assert deltas.size >= 20
    assert np.diff(off)[deltas].max() * 4 <= json_vocab.words  # each at most a quarter of a dense row
    assert not np.isin(data[off[deltas]], deltas).any()  # bases are never deltas
    nv = native_vocab(json_vocab)
    dense = native.compile_masks(nv, c.table, c.accept)
    np.testing.assert_array_equal(c.masks, dense)
    gd = dense_grammar(json_vocab, c.table, c.accept, dense, c.start)
    rng = np.random.default_rng(11)
    for _ in range(3):
        assert_batches_equal(nv, json_vocab, gd, c.native, dense, json_vocab.size + 7, rng)
    compiler_mod._MEMORY.clear()
    hit = load_cached(spec, json_vocab, tmp_path)
    assert hit is not None and hit.compressed and hit.nbytes == c.nbytes
    np.testing.assert_array_equal(hit.masks, dense)


@SETTINGS
@given(regexes(), vocabs(), st.integers(0, 2**32 - 1))
def test_random_automata_compressed_equals_dense(pattern, vocab, seed):
    dfa = compile_regex(pattern)
    dense = reference.compile_masks(vocab, dfa.table, dfa.accept)
    c = compile_dfa(dfa, vocab)
    assert c.compressed
    np.testing.assert_array_equal(c.masks, dense)
    np.testing.assert_array_equal(c.table, dfa.table)  # the byte classes expand to the same automaton
    classes, comb = c.transitions
    n_classes = len(set(classes.tolist()))
    assert isinstance(comb, Comb) and int(classes.max()) + 1 == n_classes <= 256
    # the comb holds one slot per move and no more: every owned slot is a move of its owner
    assert (comb.slots[:, 0] >= 0).sum() == (comb.columns(n_classes) >= 0).sum()
    assert comb.slots.shape[0] >= int(comb.base.max()) + n_classes
    for s in range(c.num_states):
        for t in range(vocab.size):
            assert c.step(s, t) == reference.step(vocab, dfa.table, dfa.accept, s, t)
    for s in range(-1, c.num_states):
        np.testing.assert_array_equal(
            c.allowed(s), np.unpackbits(dense[s].view(np.uint8), bitorder="little")[: vocab.size].astype(bool)
        )
    # the same batch over each form: rows at every state, walked there by the core
    nv = native_vocab(vocab)
    gd = dense_grammar(vocab, c.table, c.accept, dense, dfa.start)
    rng = np.random.default_rng(seed)
    V = vocab.size + int(rng.integers(0, 40))  # logits may be wider than the vocabulary
    assert_batches_equal(nv, vocab, gd, c.native, dense, V, rng)


def assert_batches_equal(nv, vocab: Vocab, gd, gc, dense: np.ndarray, V: int, rng: np.random.Generator) -> None:
    """Rows at random reachable states (and dead, and unconstrained ones): fill, fill_apply with and
    without a bitmask, inline and on the pool, the same on both grammars and as the dense rows say."""
    S = dense.shape[0] - 1
    B = int(rng.integers(1, 12))
    paths = []
    for _ in range(B):
        toks, s = [], gd.start
        for _ in range(int(rng.integers(0, 6))):
            allowed = np.flatnonzero(
                np.unpackbits(dense[s if s >= 0 else S].view(np.uint8), bitorder="little")[: vocab.size]
            )
            allowed = [t for t in allowed if t not in vocab.eos_ids]
            if not allowed or rng.random() < 0.1:
                toks.append(int(rng.integers(0, vocab.size)))  # may kill the row: the dead row
            else:
                toks.append(int(rng.choice(allowed)))
            s = gd.step(s, toks[-1]) if s >= 0 else -1
        paths.append(None if rng.random() < 0.15 else toks)
    logits0 = rng.standard_normal((B, V)).astype(np.float32)
    results = []
    for g in (gd, gc):
        for nthreads in (1, 0):
            batch = native.Batch(nv)
            for i, toks in enumerate(paths):
                batch.set_row(i, None if toks is None else g, None if toks is None else list(toks))
            batch.sync(B)
            W = vocab.words + 1  # a bitmask wider than the vocabulary's rows
            bits = np.zeros((B, W), np.uint32)
            batch.fill(bits, nthreads=nthreads)
            bits2 = np.zeros((B, (V + 31) // 32 + 1), np.uint32)
            l1, l2 = logits0.copy(), logits0.copy()
            batch.fill_apply(l1, bits2, nthreads=nthreads)
            batch.fill_apply(l2, nthreads=nthreads)
            results.append((bits, bits2, l1, l2))
    first = results[0]
    for other in results[1:]:
        for a, b in zip(first, other, strict=True):
            np.testing.assert_array_equal(a, b)
    # and the dense rows themselves, for the constrained rows
    for i, toks in enumerate(paths):
        if toks is None:
            continue
        s = gd.walk(gd.start, toks)
        np.testing.assert_array_equal(first[0][i, : vocab.words], dense[s if s >= 0 else S])


@pytest.mark.parametrize("name", ["json_schema", "iso_date", "email", "choice5", "order_schema_12", "choice_200"])
def test_benchmark_constraints_compressed_equal_dense(name, wide_vocab, tmp_path):
    spec = bench_constraints()[name]
    c = compile_constraint(spec, wide_vocab, cache_dir=tmp_path).complete()
    assert c.compressed
    nv = native_vocab(wide_vocab)
    dense = native.compile_masks(nv, c.table, c.accept)
    np.testing.assert_array_equal(c.masks, dense)
    gd = dense_grammar(wide_vocab, c.table, c.accept, dense, c.start)
    rng = np.random.default_rng(len(name))
    for V in (wide_vocab.size, wide_vocab.size + 50):
        assert_batches_equal(nv, wide_vocab, gd, c.native, dense, V, rng)
    # what the disk cache gives back is the same compressed form
    compiler_mod._MEMORY.clear()
    hit = load_cached(spec, wide_vocab, tmp_path)
    assert hit is not None and hit.compressed
    np.testing.assert_array_equal(hit.masks, dense)
    assert hit.nbytes == c.nbytes


def test_memory_accounting_counts_the_compressed_rows(wide_vocab, tmp_path):
    compiler_mod._MEMORY.clear()
    spec = bench_constraints()["choice_200"]
    c = compile_constraint(spec, wide_vocab, cache_dir=tmp_path)
    dense_bytes = c.num_states * 1024 + c.accept.nbytes + (c.num_states + 1) * wide_vocab.words * 4
    c.complete()  # waits for the background finisher, which compresses and writes the file
    assert c.compressed
    rows = c.native.compressed_rows
    held = sum(a.nbytes for a in (*c.transitions, c.accept, *rows))
    assert c.nbytes == held
    assert held * 4 < dense_bytes  # the point of it
    # the automaton as held, and every row dense, from the shapes
    assert (
        c.dense_bytes
        == sum(a.nbytes for a in c.transitions) + c.accept.nbytes + (c.num_states + 1) * wide_vocab.words * 4
    )
    # the in-memory cache counts the form at its compressed size (its automaton is an entry of its own),
    # the rows it shares with other forms apart (counted once for all: test_shared_rows.py)
    counted = [(size, shared) for value, size, shared in compiler_mod._MEMORY._items.values() if value is c]
    assert counted == [(c.private_nbytes, tuple(id(w) for w in c.shared_words))]
    assert c.private_nbytes + sum(w.nbytes for w in c.shared_words) == held
    files = [f for f in tmp_path.glob("*.bin") if f.stem == c.key]
    assert files and files[0].stat().st_size < held + 4096  # so does the file, header aside


def test_offsets_past_the_data_are_refused(wide_vocab):
    """An offset past the data that the next one brings back down: each row's offsets do not
    decrease from the row before and the last one ends at the data, yet row 0 would be read past
    the data's end (review finding, session 21: a crafted cache file crashed the process)."""
    c = compile_dfa(compile_regex("ab|cd|e"), wide_vocab)
    row_of, off, kind, data = (a.copy() for a in c.native.compressed_rows)
    assert len(kind) >= 3
    off[1] = off[-1] + 2000
    off[2:-1] = np.maximum(off[2:-1], off[1])
    off[-1] = len(data)
    with pytest.raises(ValueError, match="past the data"):
        native.Grammar.compressed(native_vocab(wide_vocab), *c.transitions, c.accept, row_of, off, kind, data)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda a: a[0].__setitem__(0, len(a[2])),  # a row index past the distinct rows
        lambda a: a[1].__setitem__(-1, a[1][-1] - 1),  # offsets short of the data
        lambda a: a[2].__setitem__(0, 9),  # an unknown kind
    ],
)
def test_bad_compressed_rows_are_refused(wide_vocab, break_it):
    c = compile_dfa(compile_regex("ab|cd"), wide_vocab)
    arrays = [a.copy() for a in c.native.compressed_rows]
    break_it(arrays)
    with pytest.raises(ValueError):
        native.Grammar.compressed(native_vocab(wide_vocab), *c.transitions, c.accept, *arrays)


def delta_to(arrays: list, row: int, base: int, stored: list[int] | None = None) -> None:
    """Make distinct row `row` a delta of `base` that lists no word (or holds `stored`)."""
    _row_of, off, kind, data = arrays
    words = np.array([base, 0] if stored is None else stored, np.uint32)
    arrays[3] = np.concatenate([data[: off[row]], words, data[off[row + 1] :]])
    arrays[1] = off.copy()
    arrays[1][row + 1 :] += off[row] + words.size - off[row + 1]
    kind[row] = DELTA


@pytest.mark.parametrize(
    ("deltas", "why"),
    [
        ([(1, 0, None)], None),  # a delta of an earlier row: taken
        ([(1, 1, None)], "base"),  # its own base
        ([(1, 2, None)], "base"),  # a base after it
        ([(1, 0, None), (2, 1, None)], "base"),  # a delta of a delta
        ([(1, 0, [0, 1, 5])], "length"),  # one word listed, its word missing
        ([(1, 0, [0, 2, 5, 4, 1, 1])], "word indices"),  # indices not increasing
        ([(1, 0, [0, 1, 10**6, 1])], "word indices"),  # an index past the row
    ],
)
def test_bad_delta_rows_are_refused(wide_vocab, deltas, why):
    c = compile_dfa(compile_regex("ab|cd|e"), wide_vocab)
    arrays = [a.copy() for a in c.native.compressed_rows]
    assert len(arrays[2]) >= 3
    for row, base, stored in deltas:
        delta_to(arrays, row, base, stored)
    make = lambda: native.Grammar.compressed(native_vocab(wide_vocab), *c.transitions, c.accept, *arrays)  # noqa: E731
    if why is None:
        make()
    else:
        with pytest.raises(ValueError, match=why):
            make()


def test_unsorted_ids_are_refused(wide_vocab):
    c = compile_dfa(compile_regex("ab|cd"), wide_vocab)
    row_of, off, kind, data = (a.copy() for a in c.native.compressed_rows)
    ids = [r for r in range(len(kind)) if kind[r] == 1 and off[r + 1] - off[r] >= 2]
    assert ids
    r = ids[0]
    data[off[r]], data[off[r] + 1] = data[off[r] + 1], data[off[r]]
    with pytest.raises(ValueError):
        native.Grammar.compressed(native_vocab(wide_vocab), *c.transitions, c.accept, row_of, off, kind, data)


def test_comb_slots_take_16_bits_where_the_states_fit(wide_vocab):
    """A compressed automaton of at most 32,767 states holds its comb's slots as int16, and steps,
    fills and distances read them as the class columns they pack; int32 slots, and the columns
    themselves in either width, are still taken for any."""
    c = compile_dfa(compile_regex("[a-c]{2,5}x|ab(cd)*"), wide_vocab)
    classes, comb = c.transitions
    assert isinstance(comb, Comb) and comb.slots.dtype == np.int16 and comb.base.dtype == np.int32
    assert c.table.dtype == np.int32
    columns = comb.columns(int(classes.max()) + 1)
    others = [
        native.Grammar.compressed(native_vocab(wide_vocab), classes, held, c.accept, *c.compressed_rows, c.start)
        for held in (Comb(comb.base, comb.slots.astype(np.int32)), columns, columns.astype(np.int16))
    ]
    ids = [t for t, b in enumerate(wide_vocab.tokens) if b][:300]
    for s in range(c.num_states):
        for t in ids:
            assert {g.step(s, t) for g in others} == {c.native.step(s, t)}
    np.testing.assert_array_equal(c.distances, budget.token_distances(c.table, c.accept, wide_vocab))
    for held in (comb, columns):
        np.testing.assert_array_equal(c.distances, budget.token_distances(held, c.accept, wide_vocab, classes))
        np.testing.assert_array_equal(
            budget.distances(held, c.accept, wide_vocab.single_bytes, classes),
            budget.distances(c.table, c.accept, wide_vocab.single_bytes),
        )


def test_comb_slots_stay_32_bits_past_32767_states():
    """A chain of 40,000 states (one byte each) cannot be numbered in 16 bits: int32 slots."""
    S = 40_000
    vocab = Vocab([bytes([i]) for i in range(256)], (0,), 256)
    table = np.full((S, 256), -1, np.int32)
    table[np.arange(S - 1), ord("a")] = np.arange(1, S, dtype=np.int32)
    accept = np.zeros(S, np.uint8)
    accept[-1] = 1
    masks = native.compile_masks(native_vocab(vocab), table, accept)
    g = dense_grammar(vocab, table, accept, masks).compress()
    _classes, (base, slots) = g.transitions
    assert base.shape == (S,) and slots.dtype == np.int32
    assert (slots[:, 0] >= 0).sum() == S - 1 and slots.shape[0] <= S + 1  # a slot per move, packed
    assert g.walk(0, [ord("a")] * (S - 1)) == S - 1


def test_bad_byte_classes_are_refused(wide_vocab):
    c = compile_dfa(compile_regex("ab|cd"), wide_vocab)
    classes, comb = c.transitions
    assert isinstance(comb, Comb)
    table = comb.columns(int(classes.max()) + 1)
    rows = c.native.compressed_rows
    bad_class = classes.copy()
    bad_class[7] = table.shape[1]
    bad_state = table.copy()
    bad_state[0, 0] = c.num_states
    for cl, tb in ((bad_class, table), (classes, bad_state), (classes, table[:, :0])):
        with pytest.raises(ValueError):
            native.Grammar.compressed(native_vocab(wide_vocab), cl, np.ascontiguousarray(tb), c.accept, *rows)


def broken_comb(comb: Comb, n_classes: int, how: str) -> tuple:
    base, slots = comb.base.copy(), comb.slots.copy()
    if how == "base past the slots":
        base[0] = slots.shape[0] - n_classes + 1
    elif how == "negative base":
        base[0] = -1
    elif how == "owner out of range":
        slots[0, 0] = base.shape[0]
    elif how == "next out of range":
        slots[np.flatnonzero(slots[:, 0] >= 0)[0], 1] = base.shape[0]
    elif how == "slots not pairs":
        slots = np.ascontiguousarray(np.repeat(slots, 2, axis=1)[:, :3])
    elif how == "base of another length":
        base = base[:-1]
    elif how == "not a pair":
        return (base, slots, slots)
    elif how == "base not an array":
        return (base.tolist(), slots)
    return (base, slots)


@pytest.mark.parametrize(
    "how",
    [
        "base past the slots",
        "negative base",
        "owner out of range",
        "next out of range",
        "slots not pairs",
        "base of another length",
        "not a pair",
        "base not an array",
    ],
)
def test_bad_combs_are_refused(wide_vocab, how):
    """A comb from a cache file is checked whole before any lookup: every base keeps its classes
    inside the slots, every owner and move is a state (no lookup reads outside the arrays)."""
    c = compile_dfa(compile_regex("ab|cd|[e-h]+x"), wide_vocab)
    classes, comb = c.transitions
    assert isinstance(comb, Comb)
    bad = broken_comb(comb, int(classes.max()) + 1, how)
    with pytest.raises((ValueError, TypeError)):
        native.Grammar.compressed(native_vocab(wide_vocab), classes, bad, c.accept, *c.compressed_rows)
    with pytest.raises((ValueError, TypeError)):
        native.byte_distances(bad, c.accept, np.ones(256, np.uint8), classes)
    with pytest.raises(ValueError, match="byte classes"):
        native.byte_distances(comb, c.accept, np.ones(256, np.uint8), None)


def test_cache_files_of_earlier_formats_are_recompiled(wide_vocab, tmp_path):
    spec = {"regex": "[a-c]{2,5}x"}
    c = compile_constraint(spec, wide_vocab, cache_dir=tmp_path).complete()
    path = tmp_path / f"{c.key}.bin"
    good = c.masks
    # an earlier version's magic in front of this version's layout
    raw = path.read_bytes()
    path.write_bytes(b"LLMSCST3" + raw[8:])
    assert disk_cache.read_cache(path, wide_vocab) is None
    # this version's magic and checksum over the dense layout of format 2 (table, accept, masks)
    disk_cache.write_arrays(path, c.key, {"table": c.table, "accept": c.accept, "masks": good}, {"start": c.start})
    assert disk_cache.read_cache(path, wide_vocab) is None
    compiler_mod._MEMORY.clear()
    again = compile_constraint(spec, wide_vocab, cache_dir=tmp_path).complete()
    np.testing.assert_array_equal(again.masks, good)
    hit = disk_cache.read_cache(path, wide_vocab)  # rewritten in the current format
    assert hit is not None and hit.compressed
    np.testing.assert_array_equal(hit.masks, good)


@pytest.mark.parametrize("seed", range(12))
def test_pack_comb_keeps_every_move_in_one_slot(seed):
    """Random class columns of every density (none live, a few, all): the comb looks every (state,
    class) up to the columns' entry, owns exactly one slot per move, and keeps each state's classes
    inside the slots; 16-bit slots up to 32,767 states."""
    rng = np.random.default_rng(seed)
    S, C = int(rng.integers(1, 400)), int(rng.integers(1, 80))
    density = [0.0, 0.03, 0.1, 0.5, 1.0][seed % 5]
    columns = np.where(rng.random((S, C)) < density, rng.integers(0, S, (S, C)), -1).astype(np.int32)
    base, slots = native.pack_comb(columns)
    comb = Comb(base, slots)
    assert slots.dtype == np.int16 and base.shape == (S,)
    np.testing.assert_array_equal(comb.columns(C), columns)
    assert (slots[:, 0] >= 0).sum() == (columns >= 0).sum()
    assert int(base.min()) >= 0 and int(base.max()) + C <= slots.shape[0]
    # first fit: a state never lands past the slots taken before it, so never more than the columns
    assert slots.shape[0] <= max(1, int((columns >= 0).any(1).sum())) * C


def test_arrays_the_core_checked_are_read_only(wide_vocab, tmp_path):
    """The core checks a compressed form's indices once and reads them unchecked after: the arrays it
    hands over, and those a cache file is read into, cannot be written (a base written later would
    point anywhere: review finding, session 23, reproduced as a segfault)."""
    c = compile_dfa(compile_regex("ab|cd|[e-h]+x"), wide_vocab)
    _classes, comb = c.transitions
    for array in (*comb, *c.compressed_rows):
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[0] = 0
    cached = compile_constraint({"regex": "ab|cd|[e-h]+x"}, wide_vocab, cache_dir=tmp_path).complete()
    hit = disk_cache.read_cache(tmp_path / f"{cached.key}.bin", wide_vocab)
    assert hit is not None and hit.transitions is not None and hit.compressed_rows is not None
    for array in (hit.transitions[0], *hit.transitions[1], hit.accept, *hit.compressed_rows):
        assert not array.flags.writeable


def test_misaligned_arrays_are_refused(wide_vocab):
    c = compile_dfa(compile_regex("ab|cd|[e-h]+x"), wide_vocab)
    classes, comb = c.transitions
    raw = np.zeros(comb.base.nbytes + 1, np.uint8)
    misaligned = np.frombuffer(raw.data, np.int32, count=comb.base.shape[0], offset=1)
    with pytest.raises(ValueError, match="misaligned"):
        native.byte_distances(Comb(misaligned, comb.slots), c.accept, np.ones(256, np.uint8), classes)
