"""The native DFA construction (csrc/dfa.cpp) works over byte classes and letters, not 256-wide
rows, and hands numpy a table it allocated itself: the byte table must still be the Python
reference's, state for state, and an ordinary C-contiguous int32 [S, 256] array. Its class form
(``build_dfa(classes=True)``, what a whole constraint is compiled from) must be the same automaton,
and everything downstream of it (mask rows, steps, distances, compression, the disk cache) must give
what the byte table gives."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from llmserve.constraints.budget import distances
from llmserve.constraints.compiled import CompiledConstraint
from llmserve.constraints.disk_cache import read_dfa, try_write_dfa, write_arrays
from llmserve.constraints.regex import ByteDFA, _dfa_words, _rows_words, compile_ast, compile_regex, parse
from llmserve.constraints.vocab import Vocab

PATTERNS = [
    # many byte classes, some of which every state treats alike (non-adjacent merged letters)
    r"[a-cx-z0-2]+(?:-[d-fu-w3-5]+)*",
    r"(?:[\x00-\x1f]|[ -~]|[\u0080-\u07ff]|[\u0800-\uffff]|[\U00010000-\U0010ffff])*",
    # unanchored alternatives: large subsets, many more raw states than minimal ones
    r"[a-z]*(?:lin|lnx|win|ms[a-z]*win|hp[a-z]*ux|aix|sol)[a-z]*",
    r"(?:a|b)*a(?:a|b){4}",
    # states entered from dozens of states on dozens of letters (the closing quote after each
    # count): minimisation reads those long rows of inverse transitions letter by letter
    r'"(?:[^"\\]|\\.){0,60}"',
    r"(?:[a-z]{1,3}[0-9]){1,12}[a-z]*",
    # multi-byte sets inside counted repetitions: a repetition's first copy is built, the others
    # copied from it (csrc/dfa.cpp, build_or_copy), nested copies included
    r"(?:[a-zé€\U0001F600-\U0001F64F]{2,5}[^\x00-\x7f]?){1,3}",
    # one class only, and a language of one string
    r"[\x00-\U0010ffff]*",
    r"abc",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_native_table_is_the_reference_table(pattern):
    native = compile_regex(pattern, backend="native")
    python = compile_regex(pattern, backend="python")
    assert native.table.shape == python.table.shape
    np.testing.assert_array_equal(native.table, python.table)
    np.testing.assert_array_equal(native.accept, python.accept)


def test_native_table_is_an_ordinary_array_that_outlives_its_builder():
    dfa = compile_regex(r"[a-z]+@[a-z]+\.(?:com|org)")
    table = dfa.table
    assert table.dtype == np.int32 and table.ndim == 2 and table.shape[1] == 256
    assert table.flags.c_contiguous and table.flags.writeable
    copy = table.copy()
    del dfa
    gc.collect()
    np.testing.assert_array_equal(table, copy)
    assert dfa_walk(table, b"ab@cd.org") >= 0


def dfa_walk(table, data):
    s = 0
    for b in data:
        s = int(table[s, b])
        if s < 0:
            break
    return s


def test_class_form_is_the_byte_table():
    for pattern in PATTERNS:
        dense = compile_regex(pattern)
        classes, columns = compile_ast(parse(pattern), classes=True).transitions
        assert classes.dtype == np.uint8 and classes.shape == (256,)
        assert columns.dtype == np.int32 and columns.shape[1] == int(classes.max()) + 1 <= 256
        assert columns.flags.c_contiguous
        np.testing.assert_array_equal(columns[:, classes], dense.table)


@pytest.fixture
def small_vocab():
    # every single byte, some multi-byte tokens across classes, one end of sequence (empty)
    tokens = [bytes([b]) for b in range(256)]
    tokens += [b"ab", b"a-", b"-d", b"x0", b"win", b"\xc3\xa9", b"\xe2\x82\xac", b"hpux", b"zz", b"0-2"]
    return Vocab([*tokens, None], (len(tokens),), len(tokens) + 1)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_lazy_form_over_classes_gives_the_byte_tables_masks(pattern, small_vocab):
    by_classes = compile_ast(parse(pattern), classes=True)
    dense = ByteDFA(by_classes.table.copy(), by_classes.accept, by_classes.start)  # no class form
    lazy = CompiledConstraint.lazy(small_vocab, by_classes)
    plain = CompiledConstraint.lazy(small_vocab, dense)
    assert lazy.transitions is not None and plain.transitions is None
    np.testing.assert_array_equal(lazy.masks, plain.masks)
    np.testing.assert_array_equal(lazy.distances, plain.distances)
    classes, columns = lazy.transitions
    for usable in (None, np.arange(256) % 3 != 0):  # a class is a step when any of its bytes is usable
        np.testing.assert_array_equal(
            distances(columns, lazy.accept, usable, classes), distances(dense.table, dense.accept, usable)
        )
    for s in range(lazy.num_states):
        for t in range(0, small_vocab.size, 7):
            assert lazy.step(s, t) == plain.step(s, t)
    # compressed from either form: the same fewest classes, packed into the same comb
    (classes_a, comb_a), (classes_b, comb_b) = lazy.compress().transitions, plain.compress().transitions
    np.testing.assert_array_equal(classes_a, classes_b)
    for a, b in zip(comb_a, comb_b, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_disk_cache_keeps_the_class_form_and_reads_the_byte_form(tmp_path):
    by_classes = compile_ast(parse(PATTERNS[0]), classes=True)
    try_write_dfa(tmp_path / "k.bin", "k", by_classes)
    back = read_dfa(tmp_path / "k.bin")
    assert back is not None and back.transitions is not None
    for a, b in zip(back.transitions, by_classes.transitions, strict=True):
        np.testing.assert_array_equal(a, b)
    dense = ByteDFA(by_classes.table.copy(), by_classes.accept)  # a file written by the byte form
    try_write_dfa(tmp_path / "d.bin", "d", dense)
    old = read_dfa(tmp_path / "d.bin")
    assert old is not None and old.transitions is None
    np.testing.assert_array_equal(old.table, by_classes.table)


def _runs_by_hand(row):
    runs, b = [], 0
    while b < 256:
        e = b
        while e + 1 < 256 and row[e + 1] == row[b]:
            e += 1
        if row[b] >= 0:
            runs.append((b, e, int(row[b])))
        b = e + 1
    return runs


def test_embedded_automata_are_encoded_run_by_run():
    """``_rows_words`` searches only the byte intervals where some row changes: the same runs as a
    walk over all 256 bytes of each row."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        cuts = np.sort(rng.choice(np.arange(1, 256), size=k - 1, replace=False))
        columns = rng.integers(-1, n, size=(n, k)).astype(np.int32)
        if trial % 3 == 0:
            columns[:, rng.integers(0, k)] = -1  # a dead interval
        table = np.ascontiguousarray(columns[:, np.searchsorted(cuts, np.arange(256), side="right")])
        expect: list[int] = []
        for row in table:
            runs = _runs_by_hand(row)
            expect.append(len(runs))
            for run in runs:
                expect.extend(run)
        assert _rows_words(table).tolist() == expect


def test_an_automaton_over_byte_classes_is_encoded_as_its_byte_table_is():
    """``_dfa_words`` of an automaton over byte classes (one class may cover bytes far apart)
    reads its columns per interval of one class: the same words as its expanded byte table."""
    rng = np.random.default_rng(11)
    for trial in range(200):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        classes = rng.integers(0, k, size=256).astype(np.uint8)
        if trial % 2:  # runs of one class, as the core's intervals are before classes merge
            classes = np.sort(classes)
        k = int(classes.max()) + 1
        columns = rng.integers(-1, n, size=(n, k)).astype(np.int32)
        accept = rng.integers(0, 2, size=n).astype(np.uint8)
        by_class = ByteDFA(columns, accept, 0, classes=classes)
        by_byte = ByteDFA(np.ascontiguousarray(columns[:, classes]), accept, 0)
        assert _dfa_words(by_class).tolist() == _dfa_words(by_byte).tolist()


@pytest.mark.parametrize(
    "change",
    [
        "columns_1d",
        "class_past_columns",
        "entry_past_states",
        "entry_below_dead",
        "start_past_states",
        "start_not_a_number",
        "columns_int64",
        "accept_short",
    ],
)
def test_a_dfa_file_that_checksums_but_does_not_fit_is_rebuilt_not_raised(tmp_path, change):
    """A cache file from another version, or a crafted one, passes its checksum: read_dfa must
    return None (the constraint is rebuilt) for any array out of shape, type or range, not raise
    or hand on an automaton the core would refuse at every request."""
    dfa = compile_ast(parse(PATTERNS[0]), classes=True)
    classes, columns = (a.copy() for a in dfa.transitions)
    accept, meta = dfa.accept.copy(), {"start": 0}
    if change == "columns_1d":
        columns = columns.reshape(-1)
    elif change == "class_past_columns":
        classes[7] = columns.shape[1]
    elif change == "entry_past_states":
        columns[0, 0] = columns.shape[0]
    elif change == "entry_below_dead":
        columns[0, 0] = -2
    elif change == "start_past_states":
        meta["start"] = columns.shape[0]
    elif change == "start_not_a_number":
        meta["start"] = "0"
    elif change == "columns_int64":
        columns = columns.astype(np.int64)
    else:
        accept = accept[:-1]
    write_arrays(tmp_path / "k.bin", "k", {"classes": classes, "columns": columns, "accept": accept}, meta)
    assert read_dfa(tmp_path / "k.bin") is None
