"""The native DFA construction (csrc/dfa.cpp) works over byte classes and letters, not 256-wide
rows, and hands numpy a table it allocated itself: the byte table must still be the Python
reference's, state for state, and an ordinary C-contiguous int32 [S, 256] array."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from llmserve.constraints.regex import compile_regex

PATTERNS = [
    # many byte classes, some of which every state treats alike (non-adjacent merged letters)
    r"[a-cx-z0-2]+(?:-[d-fu-w3-5]+)*",
    r"(?:[\x00-\x1f]|[ -~]|[\u0080-\u07ff]|[\u0800-\uffff]|[\U00010000-\U0010ffff])*",
    # unanchored alternatives: large subsets, many more raw states than minimal ones
    r"[a-z]*(?:lin|lnx|win|ms[a-z]*win|hp[a-z]*ux|aix|sol)[a-z]*",
    r"(?:a|b)*a(?:a|b){4}",
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
