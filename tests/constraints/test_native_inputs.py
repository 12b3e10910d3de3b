"""Malformed calls into the native core raise ValueError or TypeError; none crashes the process.

Each call runs in its own subprocess, so a segfault (or an abort) shows up as that case failing with
its signal, not as a dead test runner. The cases are the inputs a caller can get wrong: shapes,
dtypes, lengths, row and state indices, null or empty inputs, vocabulary sizes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SETUP = """
import numpy as np
from llmserve.constraints import _core as core
offsets = np.array([0, 1, 2, 3, 3], dtype=np.int64)  # tokens "a", "b", "c", and an empty one (EOS)
data = np.frombuffer(b"abc", dtype=np.uint8).copy()
vocab = core.Vocab(offsets, data, [3], 4)
table = np.full((2, 256), -1, dtype=np.int32); table[0, ord("a")] = 1; table[1, ord("b")] = 1
accept = np.array([0, 1], dtype=np.uint8)
masks = np.zeros((3, vocab.words), dtype=np.uint32)
grammar = core.Grammar(vocab, table, accept, masks, 0, False)
batch = core.Batch(vocab)
logits = np.zeros((2, 4), dtype=np.float32)
bitmask = np.zeros((2, 1), dtype=np.uint32)
"""

CASES = {
    # Vocab
    "vocab_negative_size": "core.Vocab(offsets[:0], data, [], -1)",
    "vocab_offsets_decreasing": "core.Vocab(np.array([0, 3, 1, 2, 3], np.int64), data, [3], 4)",
    "vocab_offsets_negative": "core.Vocab(np.array([-5, 1, 2, 3, 3], np.int64), data, [3], 4)",
    "vocab_offsets_past_data": "core.Vocab(np.array([0, 1, 2, 3, 99], np.int64), data, [3], 4)",
    "vocab_offsets_wrong_dtype": "core.Vocab(offsets.astype(np.int32), data, [3], 4)",
    "vocab_eos_out_of_range": "core.Vocab(offsets, data, [7], 4)",
    "vocab_none": "core.Vocab(None, data, [3], 4)",
    # tables and grammars
    "compile_masks_table_entry_out_of_range": "t = table.copy(); t[0, 5] = 9; core.compile_masks(vocab, t, accept)",
    "compile_masks_strided_table": "core.compile_masks(vocab, np.full((2, 512), -1, np.int32)[:, ::2], accept)",
    "compile_masks_accept_short": "core.compile_masks(vocab, table, accept[:1])",
    "compile_masks_table_1d": "core.compile_masks(vocab, table.reshape(-1), accept)",
    "grammar_masks_wrong_width": "core.Grammar(vocab, table, accept, np.zeros((3, 5), np.uint32), 0, False)",
    "grammar_masks_read_only_lazy": "m = masks.copy(); m.flags.writeable = False; core.Grammar(vocab, table, accept, m, 0, False)",
    "grammar_start_out_of_range": "core.Grammar(vocab, table, accept, masks, 5, False)",
    "grammar_empty_table": "core.Grammar(vocab, table[:0], accept[:0], masks[:1], 0, False)",
    # the automaton over byte classes (classes uint8[256], table int32[S, C])
    "grammar_classes_out_of_range": (
        "core.Grammar(vocab, np.full((2, 2), -1, np.int32), accept, masks, 0, False, np.full(256, 2, np.uint8))"
    ),
    "grammar_classes_short": (
        "core.Grammar(vocab, np.full((2, 2), -1, np.int32), accept, masks, 0, False, np.zeros(255, np.uint8))"
    ),
    "grammar_classes_entry_out_of_range": (
        "core.Grammar(vocab, np.full((2, 2), 5, np.int32), accept, masks, 0, False, np.zeros(256, np.uint8))"
    ),
    "grammar_classes_wrong_dtype": (
        "core.Grammar(vocab, np.full((2, 2), -1, np.int32), accept, masks, 0, False, np.zeros(256, np.int32))"
    ),
    "grammar_classes_a_list": (
        "core.Grammar(vocab, np.full((2, 2), -1, np.int32), accept, masks, 0, False, [0] * 256)"
    ),
    "token_distances_classes_out_of_range": (
        "core.token_distances(vocab, np.full((2, 1), -1, np.int32), accept, np.zeros(2, np.int32),"
        " np.arange(2, dtype=np.int32), np.ones(256, np.uint8))"
    ),
    "grammar_step_state_out_of_range": "grammar.step(1 << 20, 0)",
    "grammar_step_negative_state": "grammar.step(-7, 0)",
    "grammar_walk_state_out_of_range": "grammar.walk(2, [0, 1])",
    "grammar_ensure_state_out_of_range": "grammar.ensure(3)",
    # the batch
    "batch_set_row_negative": "batch.set_row(-1, grammar, [])",
    "batch_set_row_huge": "batch.set_row(1 << 40, grammar, [])",
    "batch_set_row_not_a_grammar": "batch.set_row(0, 'grammar', [])",
    "batch_set_row_tokens_not_a_list": "batch.set_row(0, grammar, (1, 2))",
    "batch_set_row_other_vocab_width": (
        "big = core.Vocab(np.zeros(65, np.int64), data, [], 64);"
        "batch.set_row(0, core.Grammar(big, table, accept, np.zeros((3, 2), np.uint32), 0, False), [])"
    ),
    "batch_clear_row_negative": "batch.set_row(0, grammar, []); batch.clear_row(-1)",
    "batch_move_negative": "batch.set_row(0, grammar, []); batch.move(-1, 0)",
    "batch_swap_negative": "batch.set_row(0, grammar, []); batch.swap(0, -3)",
    "batch_row_negative": "batch.set_row(0, grammar, []); batch.row(-1)",
    "batch_fill_wrong_dtype": "batch.fill(np.zeros((2, 1), np.int64))",
    "batch_fill_active_wrong_dtype": "batch.fill(bitmask, np.zeros(2, np.int64))",
    "batch_fill_active_short": "batch.fill(bitmask, np.zeros(1, np.uint8))",
    "batch_fill_apply_overlapping_rows": (
        "batch.set_row(0, grammar, []); batch.set_row(1, grammar, []);"
        "big = np.zeros(8, np.float32);"
        "batch.fill_apply(np.lib.stride_tricks.as_strided(big, (2, 4), (4, 4)))"
    ),
    "batch_fill_apply_bitmask_narrow": "batch.fill_apply(np.zeros((2, 64), np.float32), np.zeros((2, 1), np.uint32))",
    "batch_fill_apply_strided_bitmask": "batch.fill_apply(logits, np.zeros((2, 4), np.uint32)[:, ::4])",
    "batch_fill_apply_wrong_dtype": "batch.fill_apply(np.zeros((2, 4), np.float64))",
    "batch_none_vocab": "core.Batch(None)",
    # apply and build_dfa
    "apply_bitmask_short": "core.apply_bitmask(np.zeros((4, 64), np.float32), np.zeros((2, 2), np.uint32))",
    "apply_bitmask_active_short": "core.apply_bitmask(logits, bitmask, np.zeros(1, np.uint8))",
    "apply_bitmask_overlapping_rows": (
        "core.apply_bitmask(np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), (2, 4), (4, 4)), bitmask)"
    ),
    "build_dfa_empty_ast": "core.build_dfa(np.zeros(0, np.int32), 100, 1000)",
    "build_dfa_truncated_ast": "core.build_dfa(np.array([1, 5, 0, 1], np.int32), 100, 1000)",
    "build_dfa_unknown_kind": "core.build_dfa(np.array([9, 0], np.int32), 100, 1000)",
    "build_dfa_bad_range": "core.build_dfa(np.array([0, 1, 5, 2], np.int32), 100, 1000)",
    "build_dfa_deep_ast": "core.build_dfa(np.array([1, 1] * 200000 + [1, 0], np.int32), 100, 10**7)",
    "build_dfa_zero_limits": "core.build_dfa(np.array([1, 0], np.int32), 0, 0)",
    "build_dfa_wrong_dtype": "core.build_dfa(np.array([1, 0], np.int64), 100, 1000)",
    "checksum_strided": "core.checksum(np.zeros(16, np.uint8)[::2])",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_call_raises_instead_of_crashing(name):
    code = SETUP + textwrap.dedent(f"""
        try:
            {CASES[name]}
        except (ValueError, TypeError) as exc:
            print("raised", type(exc).__name__, exc)
        else:
            print("no error")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (
        f"{name}: exit {proc.returncode} (a negative code is the signal)\n{proc.stderr[-2000:]}"
    )
    assert proc.stdout.startswith("raised"), f"{name}: {proc.stdout}{proc.stderr[-2000:]}"
    assert EXPECT.get(name, "") in proc.stdout, f"{name}: {proc.stdout}"


# The class-form checks by what they say: an old core without the `classes` argument raises a
# TypeError for the extra argument, which the harness alone would count as a pass.
EXPECT = {
    "grammar_classes_out_of_range": "byte class out of range",
    "grammar_classes_short": "classes/table/accept shapes",
    "grammar_classes_entry_out_of_range": "table entry out of range",
    "grammar_classes_a_list": "classes must be a numpy array",
    "token_distances_classes_out_of_range": "byte class out of range",
}


def test_the_class_form_inputs_those_cases_break_work_when_valid():
    code = SETUP + textwrap.dedent("""
        classes = np.zeros(256, np.uint8); classes[ord("a")] = 1; classes[ord("b")] = 2
        columns = np.full((2, 3), -1, np.int32); columns[0, 1] = 1; columns[1, 2] = 1
        g = core.Grammar(vocab, columns, accept, np.zeros((3, vocab.words), np.uint32), 0, False, classes)
        assert g.step(0, 0) == 1 and g.step(1, 1) == 1 and g.step(0, 1) == -1, "steps"
        d = np.array([1, 0], np.int32)
        core.token_distances(vocab, columns, accept, d, np.array([1, 0], np.int32), classes)
        assert d.tolist() == [1, 0], d
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr[-2000:]


# The serialised AST (layout in csrc/dfa.h) is read back from the on-disk cache too, so a crafted
# array must be refused with a ValueError by both constructions: a count that is negative, larger
# than what is left of the array, or that would move the read position backwards, whether in a
# subtree that is built or in one that is stepped over (a repetition {0}: `skip`).
BIG = (1 << 31) - 1
# cat of one node of each kind: set, alt, rep, dfa, members, list (all valid)
ALL_KINDS = [1, 6, 0, 1, 97, 97, 2, 2, 0, 1, 98, 98, 1, 0, 3, 1, 2, 0, 1, 99, 99]
ALL_KINDS += [4, 2, 0, 0, 1, 1, 120, 120, 1, 0, 5, 2, 1, 1, 0, 1, 97, 97, 0, 0, 1, 98, 98, 6, 0, -1, 0, 1, 100, 100]


def skipped(words: list[int]) -> list[int]:
    """`words` as the child of a repetition {0}, which the builder steps over without building."""
    return [3, 0, 0, *words]


AST_CASES: dict[str, list[int] | str] = {
    "reviewer_crash": [3, 0, 0, 1, 2, 0, -(1 << 30), 0, 0],
    "skip_loops_in_place": skipped([1, BIG, 0, -1]),
    "set_negative_count": [0, -1],
    "set_negative_count_skipped": skipped([0, -1]),
    "set_min_count_skipped": skipped([0, -(1 << 31)]),
    "set_huge_count": [0, BIG, 0, 0],
    "set_huge_count_skipped": skipped([0, BIG, 0, 0]),
    "cat_negative_count": [1, -1],
    "cat_negative_count_skipped": skipped([1, -1]),
    "cat_huge_count": [1, BIG, 0, 0],
    "cat_huge_count_skipped": skipped([1, BIG, 0, 0]),
    "alt_negative_count": [2, -1],
    "alt_negative_count_skipped": skipped([2, -1]),
    "alt_huge_count": [2, BIG, 0, 0],
    "alt_huge_count_skipped": skipped([2, BIG, 0, 0]),
    "rep_negative_lo": [3, -1, 2, 0, 0],
    "rep_negative_lo_skipped": skipped([3, -1, 2, 0, 0]),
    "rep_bad_hi": [3, 0, -2, 0, 0],
    "rep_hi_below_lo": [3, 3, 2, 0, 0],
    "rep_huge_lo": [3, BIG, -1, 1, 0],
    "rep_huge_hi": [3, 0, BIG, 1, 0],
    "dfa_negative_size": [4, -1, 0],
    "dfa_negative_size_skipped": skipped([4, -(1 << 30), 0]),
    "dfa_huge_size": [4, BIG, 0, 1],
    "dfa_huge_size_skipped": skipped([4, BIG, 0, 1]),
    "dfa_size_past_state_limit": "[4, 200000, 0] + [0] * 400000",
    "dfa_negative_ranges": [4, 1, 0, 1, -1],
    "dfa_negative_ranges_skipped": skipped([4, 1, 0, 1, -5]),
    "dfa_huge_ranges": [4, 1, 0, 1, BIG, 0, 0, 0],
    "dfa_huge_ranges_skipped": skipped([4, 1, 0, 1, BIG, 0, 0, 0]),
    "members_negative_count": [5, -1, 0],
    "members_negative_count_skipped": skipped([5, -3, 0]),
    "members_huge_count": [5, BIG, 0, 1, 0, 0],
    "members_huge_count_skipped": skipped([5, BIG, 0, 1, 0, 0]),
    "list_negative_lo": [6, -1, 2, 0, 0],
    "list_negative_lo_skipped": skipped([6, -1, 2, 0, 0]),
    "list_bad_hi": [6, 0, -2, 0, 0],
    "list_huge_lo": [6, BIG, -1, 1, 0],
    "list_huge_hi": [6, 0, BIG, 1, 0],
    "truncated_kind": [1, 1],
    "truncated_rep": [3, 0],
    "truncated_dfa": [4, 2, 0, 0],
    "truncated_skipped": skipped([4, 2, 0, 0, 1, 1, 120]),
}

AST_SETUP = """
import time
import numpy as np
from llmserve.constraints import _core as native
def both(words, max_states=1000, max_nfa_states=100000):
    w = np.array(words, dtype=np.int32)
    for build in (native.build_dfa, native.LazyDfa):
        start = time.monotonic()
        try:
            build(w, max_states, max_nfa_states)
        except ValueError as exc:
            print("raised", build.__name__, str(exc).replace(chr(10), " "))
        else:
            print("no error", build.__name__)
        if time.monotonic() - start > 2:
            print("slow", build.__name__, round(time.monotonic() - start, 1), "s")
"""


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", sorted(AST_CASES))
def test_malformed_ast_words_raise_value_error(name):
    case = AST_CASES[name]
    proc = _run(AST_SETUP + f"both({case if isinstance(case, str) else repr(case)})\n")
    assert proc.returncode == 0, (
        f"{name}: exit {proc.returncode} (a negative code is the signal)\n{proc.stderr[-2000:]}"
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("raised ") and len(line.split()) > 2 for line in lines), (
        f"{name}: {proc.stdout}{proc.stderr[-2000:]}"
    )


def test_truncated_ast_words_raise_value_error():
    # every proper prefix of a valid array, built and stepped over
    code = AST_SETUP + textwrap.dedent(f"""
        for words in ({ALL_KINDS!r}, [3, 0, 0] + {ALL_KINDS!r}):
            w = np.array(words, dtype=np.int32)
            native.build_dfa(w, 1000, 100000)
            native.LazyDfa(w, 1000, 100000)
            for k in range(len(words)):
                both(words[:k])
    """)
    proc = _run(code)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * (len(ALL_KINDS) + len(ALL_KINDS) + 3)
    assert all(line.startswith("raised ") for line in lines), proc.stdout


def test_mutated_ast_words_succeed_or_raise_value_error():
    # a few thousand random mutations of valid arrays (every node kind), each built both ways: every
    # call succeeds or raises ValueError, none crashes, and all of them within the time limit
    code = textwrap.dedent("""
        import random, time
        import numpy as np
        from llmserve.constraints import _core as native
        from llmserve.constraints import regex

        t = np.full((3, 256), -1, np.int32); t[0, ord("x")] = 1; t[1, ord("y")] = 2; t[2, ord("y")] = 2
        dfa = ("dfa", regex.ByteDFA(t, np.array([0, 0, 1], np.uint8), 0))
        trees = [regex.parse(p) for p in ("a{2,5}b*", "(foo|ba[rz])+", "[\\u0100-\\u2000x-z]{0,3}", "(a|b{0}c)*[^q]")]
        trees.append(("cat", [regex.parse('"k":'), ("members", [(True, regex.parse("[0-9]+")), (False, dfa)], True)]))
        trees.append(("list", ("alt", [dfa, regex.parse("n{1,2}")]), 1, None))
        trees.append(("rep", ("list", ("members", [(False, regex.parse("a"))], False), 0, 2), 0, 0))
        valid = [regex.serialize_ast(tree).tolist() for tree in trees]
        for words in valid:
            native.build_dfa(np.array(words, np.int32), 200, 5000)
        specials = [-(1 << 31), -(1 << 30), -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 255, 0x10FFFF, 1 << 30, (1 << 31) - 1]
        rng = random.Random(1234)
        start = time.monotonic()
        counts = {"ok": 0, "ValueError": 0}
        for i in range(5000):
            words = list(rng.choice(valid))
            for _ in range(rng.randint(1, 3)):
                if not words:
                    break
                k = rng.randrange(len(words))
                op = rng.random()
                if op < 0.6:
                    words[k] = rng.choice(specials) if rng.random() < 0.7 else rng.randint(-(1 << 31), (1 << 31) - 1)
                elif op < 0.75:
                    words[k] = (words[k] + rng.choice((-1, 1)) + (1 << 31)) % (1 << 32) - (1 << 31)
                elif op < 0.85:
                    del words[k:]
                elif op < 0.95:
                    words.insert(k, rng.choice(specials))
                else:
                    del words[k]
            w = np.array(words, np.int32)
            for build in (native.build_dfa, native.LazyDfa):
                try:
                    build(w, 200, 5000, 2000)
                    counts["ok"] += 1
                except ValueError:
                    counts["ValueError"] += 1
        print("done", counts, round(time.monotonic() - start, 1))
    """)
    try:
        proc = _run(code, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the mutated arrays took more than 60 s")
    assert proc.returncode == 0, f"exit {proc.returncode} (a negative code is the signal)\n{proc.stderr[-2000:]}"
    assert proc.stdout.startswith("done"), proc.stdout + proc.stderr[-2000:]
    assert "'ok': 0," not in proc.stdout, f"no mutation was valid: {proc.stdout}"
