"""Constraint processor benchmark on a real 100k vocabulary (cl100k_base from the npm package
js-tiktoken, MIT, fetched with `npm pack` into a cache outside the repository).

Measures, side by side in one run, for a 5-field JSON schema, an ISO-date regex, an e-mail regex and
a 5-way choice:

* compile time: median of several cold compiles (fresh disk-cache directory, in-memory memo
  cleared), each engine measured up to its first mask of one row at the start state, so lazy
  engines are comparable (``llmserve``: ``compile_constraint`` + first fill; ``llmserve_full``:
  ``compile_constraint`` + ``complete()``, i.e. every state's mask and the disk cache written;
  ``xgrammar``: fresh compiler without cache + matcher + first mask; ``llguidance``: matcher
  construction + first mask), and from llmserve's on-disk cache;
* per-step mask fill for B = 1, 8, 32, 128, 256 rows at different states, and fill+apply on a
  [B, V] float32 logits tensor, for llmserve (C++ core), xgrammar (BatchGrammarMatcher),
  llguidance (fill_next_token_bitmask_par) and two pure-Python per-request baselines:
  ``python_loop`` (the classic outlines-style design: index state -> allowed token ids built ahead of
  time, then per request a Python DFA step and a bitmask built from the ids with numpy) and
  ``python_row_copy`` (our own precomputed packed rows, copied per request from Python);
  plus the memory floor (one read + one write of [B, V] float32);
* mask agreement: every filled row of ours against xgrammar's and llguidance's row for the same
  prefix, with the tokens only one side allows.

It is a by-hand benchmark: nothing here asserts on timings.

    python benchmarks/constraints/bench.py [--out results.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmserve.constraints import CompiledConstraint, ConstraintError, ConstraintSpec, Vocab, compile_constraint
from llmserve.constraints import compiler as compiler_mod
from llmserve.constraints.native import native, native_vocab

CACHE = Path(os.environ.get("LLMSERVE_BENCH_CACHE", Path.home() / ".cache" / "llmserve-bench"))
JS_TIKTOKEN = "js-tiktoken@1.0.21"
SIZES = (1, 8, 32, 128, 256)
QUICK_SIZES = (1, 8, 256)
BIG = 256
SMALL = 8

SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "failed", "pending"]},
        "count": {"type": "integer"},
        "valid": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
    },
    "required": ["status", "count", "valid", "tags", "owner"],
}
DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
EMAIL = r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}"
CHOICES = ["positive", "negative", "neutral", "mixed", "unknown"]
CASES = {
    "json_schema": (
        {"json_schema": SCHEMA},
        '{"status":"ok","count":42,"valid":true,"tags":["a","bc"],"owner":{"name":"Jo é","age":3}}',
    ),
    "iso_date": ({"regex": DATE}, "2024-05-17"),
    "email": ({"regex": EMAIL}, "john.doe@example.com"),
    "choice5": ({"choice": CHOICES}, "neutral"),
}
OTHERS = ("xgrammar", "llguidance")
# shown next to the targets, no target of their own
INFO = (
    ("python_row_copy_over_llmserve_fill_B256", "python_row_copy / ours fill B256 (info)"),
    ("compile_full_over_fastest", "compile+complete / fastest other (info)"),
)

# the targets: (ratio key, description, predicate)
TARGETS = (
    ("fill_apply_B256_over_floor", "fill+apply B256 / floor (<=1.5)", lambda v: v <= 1.5),
    ("fill_apply_B256_vs_best_other", "fill+apply B256 / best other (<1)", lambda v: v < 1.0),
    # small batches must not pay for the thread pool (issue #17 item 4)
    ("fill_apply_B1_over_floor", "fill+apply B1 / floor (<=1.5)", lambda v: v <= 1.5),
    ("fill_apply_B1_vs_best_other", "fill+apply B1 / best other (<1)", lambda v: v < 1.0),
    ("fill_apply_B8_over_floor", "fill+apply B8 / floor (<=1.5)", lambda v: v <= 1.5),
    ("fill_apply_B8_vs_best_other", "fill+apply B8 / best other (<1)", lambda v: v < 1.0),
    ("fill_B256_vs_best_other", "fill B256 / best other (<1)", lambda v: v < 1.0),
    ("per_row_fill_B256_over_B8", "per-row fill B256/B8 (<=1.2)", lambda v: v <= 1.2),
    ("python_loop_over_llmserve_fill_B256", "python_loop / ours fill B256 (>=10)", lambda v: v >= 10),
    ("compile_over_fastest", "compile / fastest other (<=2)", lambda v: v <= 2.0),
    ("disk_cache_compile_ms", "disk cache ms (<1)", lambda v: v < 1.0),
)


def cl100k_vocab() -> Vocab:
    ranks = CACHE / "cl100k_base.js"
    if not ranks.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                ["npm", "pack", JS_TIKTOKEN, "--silent", "--pack-destination", tmp],
                check=True,
                capture_output=True,
                timeout=300,
            )
            tgz = next(Path(tmp).glob("js-tiktoken-*.tgz"))
            with tarfile.open(tgz) as tf:
                member = tf.getmember("package/dist/ranks/cl100k_base.js")
                ranks.write_bytes(tf.extractfile(member).read())
    text = ranks.read_text()
    text = text[text.index("{") : text.rindex("}") + 1]  # `export default {...};`
    return Vocab.from_tiktoken_ranks(text)


def timeit(fn, reps, warm=2):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def byte_token_ids(vocab: Vocab) -> dict[int, int]:
    out = {}
    for i, t in enumerate(vocab.tokens):
        if t is not None and len(t) == 1 and t[0] not in out:
            out[t[0]] = i
    return out


def complete(ours) -> None:
    """Blocks until every state's mask is computed (and the disk cache written), where the core is lazy."""
    fn = getattr(ours, "complete", None)
    if fn is not None:
        fn()


def clear_memo() -> None:
    memo = getattr(compiler_mod, "_MEMORY", None)
    if memo is not None:
        memo.clear()


def bits_of(bitmask: np.ndarray, V: int) -> np.ndarray:
    """Bool [B, V] from a packed [B, W] 32-bit bitmask (any 32-bit dtype, little-endian bit order)."""
    return np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=1, bitorder="little")[:, :V].astype(bool)


def prefix_text(ids, vocab: Vocab) -> str:
    return b"".join(vocab.token_bytes(t) or b"" for t in ids).decode("utf-8", "backslashreplace")


def token_label(vocab: Vocab, tok: int) -> str:
    if tok in vocab.eos_ids:
        return "<eos>"
    data = vocab.token_bytes(tok)
    return f"<special {tok}>" if data is None else repr(data)[1:]


WS = frozenset(b" \t\n\r")


def examples(vocab: Vocab, ids: np.ndarray, k: int = 6) -> list[str]:
    """A few of ``ids``, shortest byte strings first (the most telling)."""
    keyed = sorted(ids.tolist(), key=lambda t: (len(vocab.token_bytes(t) or b""), t))
    return [token_label(vocab, t) for t in keyed[:k]]


# ------------------------------------------------------------------------------ pure-Python loop


class PythonLoop:
    """The per-request design a Python developer would write (outlines-style). Built once per
    constraint (not timed): state -> numpy array of the allowed token ids, the DFA as lists. Per step
    and per request: a Python DFA step by the newest token, then that row's packed bitmask built from
    the allowed ids with numpy (and, for fill+apply, that row of the logits masked)."""

    def __init__(self, ours):
        t = time.perf_counter()
        self.vocab = ours.vocab
        self.table = ours.table.tolist()
        self.accept = [bool(a) for a in ours.accept]
        self.eos = frozenset(ours.vocab.eos_ids)
        S = ours.num_states
        self.allowed_ids = [np.flatnonzero(ours.allowed(s)) for s in range(S)]
        self.dead_ids = np.flatnonzero(ours.allowed(-1))
        self.V = ours.vocab.size
        self.nbits = ours.vocab.words * 32
        self.build_s = time.perf_counter() - t

    def step(self, state: int, token: int) -> int:
        if state < 0:
            return -1
        if token in self.eos:
            return state if self.accept[state] else -1
        data = self.vocab.token_bytes(token)
        if not data:
            return -1
        table = self.table
        for b in data:
            state = table[state][b]
            if state < 0:
                return -1
        return state

    def row_bits(self, state: int) -> np.ndarray:
        bits = np.zeros(self.nbits, dtype=bool)
        bits[self.allowed_ids[state] if state >= 0 else self.dead_ids] = True
        return bits

    def fill(self, states, newest, out):
        for r in range(len(states)):
            s = self.step(states[r], newest[r]) if newest[r] >= 0 else states[r]
            bits = self.row_bits(s)
            out[r] = np.packbits(bits, bitorder="little").view(np.uint32)

    def fill_apply(self, states, newest, out, logits):
        neg = float("-inf")
        V = self.V
        for r in range(len(states)):
            s = self.step(states[r], newest[r]) if newest[r] >= 0 else states[r]
            bits = self.row_bits(s)
            out[r] = np.packbits(bits, bitorder="little").view(np.uint32)
            logits[r][~bits[:V]] = neg


# ------------------------------------------------------------------------------------- compile


def xgr_compile(compiler, spec):
    """The same language as ours: compact JSON (no whitespace, "," and ":" separators; xgrammar's
    default separators with any_whitespace=False are ", " and ": "), additional properties off
    (strict_mode, the default)."""
    if spec.kind == "json_schema":
        return compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    if spec.kind == "regex":
        return compiler.compile_regex(spec.value)
    return compiler.compile_regex("(" + "|".join(CHOICES) + ")")


def llg_grammar(spec):
    """Compact JSON (whitespace_flexible off: "," and ":" separators). llguidance keeps the JSON
    Schema default additionalProperties: true, ours and xgrammar's strict mode do not: the mask
    check shows where that matters."""
    import llguidance as llg

    if spec.kind == "json_schema":
        return llg.grammar_from("json_schema", json.dumps({**SCHEMA, "x-guidance": {"whitespace_flexible": False}}))
    if spec.kind == "regex":
        return llg.grammar_from("regex", spec.value)
    return llg.grammar_from("regex", "(" + "|".join(CHOICES) + ")")


def median_compile(fn, runs):
    ts = []
    for _ in range(runs):
        ts.append(fn())
    return statistics.median(ts), ts


def measure_compile(spec, vocab, nv, xinfo, lltok, lgram, executor, runs, cache_root: Path):
    V, W = vocab.size, vocab.words
    out: dict[str, float] = {}
    raw: dict[str, list[float]] = {}
    one = np.zeros((1, W), np.uint32)
    batch1 = native.Batch(nv)
    counter = [0]

    def fresh_dir() -> Path:
        counter[0] += 1
        return cache_root / f"cold-{spec.kind}-{counter[0]}"

    def compile_first_fill(cache_dir):
        """compile_constraint + the first mask of one row at the start state; (seconds, compiled)."""
        clear_memo()
        t = time.perf_counter()
        c = compile_constraint(spec, vocab, cache_dir=cache_dir)
        batch1.set_row(0, c.native, [])
        batch1.sync(1)
        batch1.fill(one)
        dt = time.perf_counter() - t
        batch1.clear_row(0)
        return dt, c

    def ours_ready():
        dt, c = compile_first_fill(fresh_dir())
        complete(c)  # let any background work finish outside the timed region
        return dt

    def ours_full():
        d = fresh_dir()
        clear_memo()
        t = time.perf_counter()
        c = compile_constraint(spec, vocab, cache_dir=d)
        complete(c)
        return time.perf_counter() - t

    def xgr_ready():
        import xgrammar as xgr

        xb = xgr.allocate_token_bitmask(1, V)
        t = time.perf_counter()
        g = xgr_compile(xgr.GrammarCompiler(xinfo, max_threads=native.pool_size(), cache_enabled=False), spec)
        xgr.GrammarMatcher(g).fill_next_token_bitmask(xb, 0)
        return time.perf_counter() - t

    def llg_ready():
        import llguidance as llg
        import llguidance.numpy as lnp

        lb = np.zeros((1, W), np.int32)
        t = time.perf_counter()
        m = llg.LLMatcher(lltok, lgram)
        lnp.fill_next_token_bitmask_par(executor, [(m, 0)], lb)  # llguidance is lazy: first mask included
        return time.perf_counter() - t

    for name, fn in (
        ("llmserve", ours_ready),
        ("llmserve_full", ours_full),
        ("xgrammar", xgr_ready),
        ("llguidance", llg_ready),
    ):
        fn()  # warm-up (imports, first-touch allocations); not counted
        out[name], raw[name] = median_compile(fn, runs)

    # the on-disk cache: populated by a completed compile, then read back with the memo cleared
    warm_dir = fresh_dir()
    clear_memo()
    complete(compile_constraint(spec, vocab, cache_dir=warm_dir))

    def disk():
        clear_memo()
        t = time.perf_counter()
        compile_constraint(spec, vocab, cache_dir=warm_dir)
        return time.perf_counter() - t

    def disk_first_fill():
        return compile_first_fill(warm_dir)[0]

    disk()
    out["llmserve_disk_cache"], raw["llmserve_disk_cache"] = median_compile(disk, 20)
    out["llmserve_disk_cache_first_fill"], raw["llmserve_disk_cache_first_fill"] = median_compile(disk_first_fill, 20)
    clear_memo()
    return out, raw


# ------------------------------------------------------------------------------------ agreement


def compare(vocab, ours_bm, other_bm, prefixes, rejected, details, seen):
    """Rows of ``ours_bm`` against ``other_bm``; distinct disagreeing prefixes go to ``details``."""
    V = vocab.size
    a, b = bits_of(ours_bm, V), bits_of(other_bm, V)
    only_ours, only_theirs = a & ~b, b & ~a
    n_o, n_t = only_ours.sum(axis=1), only_theirs.sum(axis=1)
    agree = int(((n_o == 0) & (n_t == 0)).sum())
    for r in np.flatnonzero((n_o > 0) | (n_t > 0)).tolist():
        plen = len(prefixes[r])
        if plen in seen:
            continue
        seen.add(plen)
        oo, ot = np.flatnonzero(only_ours[r]), np.flatnonzero(only_theirs[r])
        details.append(
            {
                "prefix_len": plen,
                "prefix": prefix_text(prefixes[r], vocab),
                "engine_rejected_prefix": plen in rejected,
                "ours_allowed": int(a[r].sum()),
                "theirs_allowed": int(b[r].sum()),
                "ours_only": int(n_o[r]),
                "theirs_only": int(n_t[r]),
                "ours_only_ws": int(sum(1 for t in oo.tolist() if WS & set(vocab.token_bytes(t) or b""))),
                "theirs_only_ws": int(sum(1 for t in ot.tolist() if WS & set(vocab.token_bytes(t) or b""))),
                "eos_differs": bool(any(e in oo or e in ot for e in vocab.eos_ids)),
                "ours_only_examples": examples(vocab, oo),
                "theirs_only_examples": examples(vocab, ot),
                "theirs_allowed_examples": examples(vocab, np.flatnonzero(b[r])) if b[r].sum() <= 4 else [],
            }
        )
        details[-1]["kind"] = kind_of(details[-1])
    rej_rows = sum(1 for p in prefixes if len(p) in rejected)
    return {"rows": len(prefixes), "agree": agree, "rows_on_rejected_prefix": rej_rows}


def kind_of(d) -> str:
    if d["engine_rejected_prefix"]:
        return "engine rejected the prefix"
    if d["theirs_only"] == 0 and d["theirs_allowed"] == 1:
        return "engine allows a single token, ours more (forced bytes)"
    if d["theirs_only"] == 0:
        return "ours allows more"
    if d["ours_only"] == 0:
        return "engine allows more"
    return "both ways"


def print_disagreements(eng, details, per_kind=2):
    """Compact: the distinct disagreeing prefixes by kind, a few examples of each (all in the JSON)."""
    if not details:
        return
    kinds: dict[str, list] = {}
    for d in details:
        kinds.setdefault(kind_of(d), []).append(d)
    eos = sum(1 for d in details if d["eos_differs"])
    print(
        f"  {eng}: {len(details)} distinct prefixes differ (EOS differs in {eos}): "
        + "; ".join(f"{k}: {len(v)}" for k, v in kinds.items())
    )
    for k, ds in kinds.items():
        groups: dict = {}  # distinct (ours-only, theirs-only) patterns, most frequent first
        for d in ds:
            groups.setdefault((tuple(d["ours_only_examples"]), tuple(d["theirs_only_examples"])), []).append(d)
        for g in sorted(groups.values(), key=len, reverse=True)[:per_kind]:
            d = g[0]
            print(
                f"    [{k}] after {d['prefix'][-40:]!r}"
                + (f" (+{len(g) - 1} prefixes)" if len(g) > 1 else "")
                + f": ours-only {d['ours_only']}"
                + (f" e.g. {d['ours_only_examples']}" if d["ours_only"] else "")
                + f"; {eng}-only {d['theirs_only']}"
                + (f" e.g. {d['theirs_only_examples']}" if d["theirs_only"] else "")
                + (f"; {eng} allows {d['theirs_allowed_examples']}" if d.get("theirs_allowed_examples") else "")
                + ("; EOS differs" if d["eos_differs"] else "")
            )


# ------------------------------------------------------------------------------------------ main


def fmt_ratio(key, v):
    return f"{v:.3f}" if key != "disk_cache_compile_ms" else f"{v:.3f} ms"


@dataclass
class Setup:
    """What every case shares: the vocabulary in each engine's form, the run's sizes and repetitions."""

    vocab: Vocab
    nv: Any  # _core.Vocab
    byte_ids: dict[int, int]
    xinfo: Any  # xgrammar.TokenizerInfo
    lltok: Any  # llguidance.LLTokenizer
    executor: Any  # llguidance.numpy.LLExecutor
    cache_root: Path
    sizes: tuple[int, ...]
    reps_small: int
    reps_big: int
    compile_runs: int

    @property
    def V(self) -> int:
        return self.vocab.size

    @property
    def W(self) -> int:
        return self.vocab.words


class ByteTokenizer:
    """The tokenizer llguidance's TokenizerWrapper reads: our tokens, encoding text byte by byte."""

    def __init__(self, vocab: Vocab, tokens_bytes: list[bytes], byte_ids: dict[int, int]):
        self.eos_token_id = vocab.eos_ids[0]
        self.bos_token_id = None
        self.tokens = tokens_bytes
        self.special_token_ids = [i for i, t in enumerate(vocab.tokens) if t is None]
        self.byte_ids = byte_ids

    def __call__(self, s):
        data = s if isinstance(s, bytes) else s.encode()
        return [self.byte_ids[b] for b in data]


def setup(quick: bool, cache_root: Path) -> Setup:
    import llguidance as llg
    import llguidance.numpy as lnp
    import xgrammar as xgr

    t = time.perf_counter()
    vocab = cl100k_vocab()
    nv = native_vocab(vocab)
    prep = time.perf_counter() - t
    byte_ids = byte_token_ids(vocab)
    eos = vocab.eos_ids[0]
    lazy = hasattr(CompiledConstraint, "complete")
    print(
        f"vocabulary cl100k_base: {vocab.size} tokens, eos {eos}; preparation {prep:.2f}s; "
        f"threads {native.pool_size()}; lazy masks (complete()): {lazy}"
    )
    tokens_bytes = [t if t is not None else b"" for t in vocab.tokens]
    xinfo = xgr.TokenizerInfo(tokens_bytes, xgr.VocabType.RAW, vocab_size=vocab.size, stop_token_ids=[eos])
    lltok = llg.LLTokenizer(llg.TokenizerWrapper(ByteTokenizer(vocab, tokens_bytes, byte_ids)))
    reps_small, reps_big = (5, 3) if quick else (30, 10)
    return Setup(
        vocab,
        nv,
        byte_ids,
        xinfo,
        lltok,
        lnp.LLExecutor(),
        cache_root,
        QUICK_SIZES if quick else SIZES,
        reps_small,
        reps_big,
        3 if quick else 5,
    )


def xgr_matchers(xg, prefixes, rejected: dict, vocab: Vocab) -> list:
    """One xgrammar matcher per prefix; a token it rejects stops that prefix there (recorded)."""
    import xgrammar as xgr

    xms = []
    for p in prefixes:
        m = xgr.GrammarMatcher(xg)
        for i, tok in enumerate(p):
            if not m.accept_token(tok):  # xgrammar disagrees with the sample: stay here
                rejected.setdefault(
                    len(p),
                    {
                        "prefix_len": len(p),
                        "at": i,
                        "accepted_prefix": prefix_text(p[:i], vocab),
                        "token": token_label(vocab, tok),
                    },
                )
                break
        xms.append(m)
    return xms


def llg_matchers(env: Setup, lgram, prefixes, rejected: dict) -> list:
    """One llguidance matcher per prefix (a rejected token would put the matcher in its error state:
    each token is validated first, and a rejection stops that prefix there, recorded)."""
    import llguidance as llg

    lms = []
    for p in prefixes:
        m = llg.LLMatcher(env.lltok, lgram)
        for i, tok in enumerate(p):
            if m.validate_tokens([tok]) != 1 or not m.consume_token(tok):
                rejected.setdefault(
                    len(p),
                    {
                        "prefix_len": len(p),
                        "at": i,
                        "accepted_prefix": prefix_text(p[:i], env.vocab),
                        "token": token_label(env.vocab, tok),
                        "error": m.get_error() or "",
                    },
                )
                break
        lms.append(m)
    return lms


def python_baselines(ours, pyloop, lists, lnp_):
    """The pure-Python baselines over the same rows, one step per request (advance by the newest
    token, then the row): fill and fill+apply of ``python_loop`` and of ``python_row_copy``, and the
    bitmask each fills."""
    B, W, V = len(lists), ours.vocab.words, ours.vocab.size
    base = [ours.walk(lst[:-1]) for lst in lists]
    newest = [lst[-1] if lst else -1 for lst in lists]
    pbm = np.zeros((B, W), np.uint32)

    def pyloop_fill():
        pyloop.fill(base, newest, pbm)

    def pyloop_fill_apply():
        pyloop.fill_apply(base, newest, pbm, lnp_)

    masks = ours.masks
    cbm = np.zeros((B, W), np.uint32)

    def rowcopy_fill():
        for r in range(B):
            s = ours.step(base[r], newest[r]) if newest[r] >= 0 else base[r]
            cbm[r] = masks[s if s >= 0 else ours.num_states]

    neg = float("-inf")

    def rowcopy_fill_apply():
        rowcopy_fill()
        bits = np.unpackbits(cbm.view(np.uint8), axis=1, bitorder="little")[:, :V]
        for r in range(B):
            lnp_[r][bits[r] == 0] = neg

    return pyloop_fill, pyloop_fill_apply, rowcopy_fill, rowcopy_fill_apply, pbm, cbm


@dataclass
class BatchRun:
    fill: dict[str, float]
    fill_apply: dict[str, float]
    floor: float
    masks: dict[str, np.ndarray]  # the bitmask each engine filled: llmserve, xgrammar, llguidance
    python_agrees: bool  # both pure-Python baselines filled what llmserve filled


def measure_batch(env: Setup, B: int, prefixes, ours, xg, lgram, pyloop, rejected: dict) -> BatchRun:
    """Fill and fill+apply timings of every engine for B rows at the states ``prefixes`` lead to."""
    import llguidance.numpy as lnp
    import llguidance.torch as ltorch
    import xgrammar as xgr

    V, W = env.V, env.W
    reps = env.reps_small if B <= 32 else env.reps_big
    py_reps = max(3, reps // 5)
    # ours: rows at different states
    batch = native.Batch(env.nv)
    lists = [list(p) for p in prefixes]
    for r in range(B):
        batch.set_row(r, ours.native, lists[r])
    batch.sync(B)
    bm = np.zeros((B, W), np.uint32)
    logits = torch.randn(B, V)
    lnp_ = logits.numpy()

    def ours_fill():
        batch.sync(B)
        batch.fill(bm)

    def ours_fill_apply():
        batch.sync(B)
        batch.fill_apply(lnp_)

    xms = xgr_matchers(xg, prefixes, rejected["xgrammar"], env.vocab)
    xbm = xgr.allocate_token_bitmask(B, V)
    xbatch = xgr.BatchGrammarMatcher(max_threads=native.pool_size())

    def x_fill():
        xbatch.batch_fill_next_token_bitmask(xms, xbm)

    def x_fill_apply():
        xbatch.batch_fill_next_token_bitmask(xms, xbm)
        xgr.apply_token_bitmask_inplace(logits, xbm)

    lms = llg_matchers(env, lgram, prefixes, rejected["llguidance"])
    lbm = np.zeros((B, W), np.int32)
    pairs = [(m, i) for i, m in enumerate(lms)]

    def l_fill():
        lnp.fill_next_token_bitmask_par(env.executor, pairs, lbm)

    def l_fill_apply():
        lnp.fill_next_token_bitmask_par(env.executor, pairs, lbm)
        lnp.apply_token_bitmask_inplace(lnp_, lbm)

    lbm_t = torch.from_numpy(lbm)

    def l_fill_apply_torch():
        # llguidance's torch apply is a torch.compile'd kernel, faster than its numpy one on CPU
        lnp.fill_next_token_bitmask_par(env.executor, pairs, lbm)
        ltorch.apply_token_bitmask_inplace(logits, lbm_t)

    pyloop_fill, pyloop_fill_apply, rowcopy_fill, rowcopy_fill_apply, pbm, cbm = python_baselines(
        ours, pyloop, lists, lnp_
    )

    def floor():
        np.multiply(lnp_, 1.0, out=lnp_)

    def floor_torch():
        logits.mul_(1.0)

    fill = {
        "llmserve": timeit(ours_fill, reps),
        "xgrammar": timeit(x_fill, reps),
        "llguidance": timeit(l_fill, reps),
        "python_loop": timeit(pyloop_fill, py_reps, 1),
        "python_row_copy": timeit(rowcopy_fill, py_reps, 1),
    }
    # the masks each engine filled, for the agreement check
    ours_fill(), x_fill(), l_fill(), pyloop_fill(), rowcopy_fill()
    filled = {"llmserve": bm.copy(), "xgrammar": xbm.numpy().copy(), "llguidance": lbm.copy()}
    python_agrees = bool(np.array_equal(pbm, filled["llmserve"]) and np.array_equal(cbm, filled["llmserve"]))
    fa = {
        "llmserve": timeit(ours_fill_apply, reps),
        "xgrammar": timeit(x_fill_apply, reps),
        "llguidance": timeit(l_fill_apply, reps),
        "llguidance_torch": timeit(l_fill_apply_torch, reps, warm=3),  # the first calls compile it
        "python_loop": timeit(pyloop_fill_apply, py_reps, 1),
        "python_row_copy": timeit(rowcopy_fill_apply, py_reps, 1),
    }
    fl = min(timeit(floor, 3 * reps), timeit(floor_torch, 3 * reps))  # cheap: more reps, less noise
    return BatchRun(fill, fa, fl, filled, python_agrees)


def best_other(times: dict[str, float]) -> str:
    """The fastest other engine (or other engine's apply kernel) in one timing dict; the Python
    loops are baselines of a design, not engines."""
    return min((k for k in times if k in OTHERS or k.startswith("llguidance")), key=times.__getitem__)


def case_ratios(res: dict) -> dict[str, float]:
    """The ratios the targets and the info columns read, from one case's timings."""
    fa_b, f_b = res["fill_apply_s"][BIG], res["fill_s"][BIG]
    others_c = min(res["compile_s"][e] for e in OTHERS)
    small = {}
    for B in (1, SMALL):
        fa = res["fill_apply_s"][B]
        small[f"fill_apply_B{B}_over_floor"] = fa["llmserve"] / res["floor_s"][B]
        small[f"fill_apply_B{B}_vs_best_other"] = fa["llmserve"] / fa[best_other(fa)]
    return {
        "fill_apply_B256_over_floor": fa_b["llmserve"] / res["floor_s"][BIG],
        "fill_apply_B256_vs_best_other": fa_b["llmserve"] / fa_b[best_other(fa_b)],
        **small,
        "fill_B256_vs_best_other": f_b["llmserve"] / min(v for k, v in f_b.items() if k != "llmserve"),
        "per_row_fill_B256_over_B8": (f_b["llmserve"] / BIG) / (res["fill_s"][SMALL]["llmserve"] / SMALL),
        "python_loop_over_llmserve_fill_B256": f_b["python_loop"] / f_b["llmserve"],
        "python_row_copy_over_llmserve_fill_B256": f_b["python_row_copy"] / f_b["llmserve"],
        "python_loop_over_llmserve_fill_apply_B256": fa_b["python_loop"] / fa_b["llmserve"],
        "compile_over_fastest": res["compile_s"]["llmserve"] / others_c,
        "compile_full_over_fastest": res["compile_s"]["llmserve_full"] / others_c,
        "disk_cache_compile_ms": res["compile_s"]["llmserve_disk_cache_first_fill"] * 1e3,
    }


def print_agreement(agreement: dict, B: int) -> None:
    line = []
    for eng in OTHERS:
        s = agreement[eng]["by_B"][B]
        line.append(
            f"{eng} {s['agree']}/{s['rows']} rows agree"
            + (
                f" ({s['rows_on_rejected_prefix']} rows on a prefix it rejected)"
                if s["rows_on_rejected_prefix"]
                else ""
            )
        )
    print("  agreement: " + "; ".join(line))


def finish_agreement(agreement: dict, rejected: dict) -> None:
    """Sort each engine's rejections and disagreements, and print them."""
    for eng in OTHERS:
        a = agreement[eng]
        a["rejections"] = sorted(rejected[eng].values(), key=lambda d: d["prefix_len"])
        a["disagreements"].sort(key=lambda d: d["prefix_len"])
        for rj in a["rejections"]:
            print(
                f"  !! {eng} rejected token {rj['token']} after {rj['accepted_prefix']!r} "
                f"(sample prefix of {rj['prefix_len']} bytes){': ' + rj['error'] if rj.get('error') else ''}"
            )
        print_disagreements(eng, a["disagreements"])


def run_case(env: Setup, name: str, spec_obj: dict, sample: str) -> dict:
    import xgrammar as xgr

    print(f"\n== {name}")
    spec = ConstraintSpec(*next(iter(spec_obj.items())))
    res: dict[str, Any] = {"compile_s": {}, "fill_s": {}, "fill_apply_s": {}, "floor_s": {}}
    lgram = llg_grammar(spec)

    # ---- compile (median of cold runs), then the instance used below
    comp, raw = measure_compile(
        spec, env.vocab, env.nv, env.xinfo, env.lltok, lgram, env.executor, env.compile_runs, env.cache_root
    )
    res["compile_s"], res["compile_runs_s"] = comp, raw
    print(f"compile ms (median of {env.compile_runs}):", {k: round(v * 1e3, 3) for k, v in comp.items()})
    clear_memo()
    ours = compile_constraint(spec, env.vocab, cache_dir=env.cache_root / f"main-{name}")
    complete(ours)
    xg = xgr_compile(xgr.GrammarCompiler(env.xinfo, max_threads=native.pool_size(), cache_enabled=False), spec)
    pyloop = PythonLoop(ours)
    res["python_loop_index_build_s"] = pyloop.build_s
    res["num_states"] = ours.num_states

    sample_ids = [env.byte_ids[b] for b in sample.encode()]
    agreement = res["agreement"] = {e: {"by_B": {}, "disagreements": [], "rejections": []} for e in OTHERS}
    seen: dict[str, set[int]] = {e: set() for e in OTHERS}
    rejected: dict[str, dict] = {e: {} for e in OTHERS}  # prefix length -> rejection record
    for B in env.sizes:
        prefixes = [sample_ids[: (r * 7) % len(sample_ids)] for r in range(B)]
        run = measure_batch(env, B, prefixes, ours, xg, lgram, pyloop, rejected)
        res["fill_s"][B], res["fill_apply_s"][B], res["floor_s"][B] = run.fill, run.fill_apply, run.floor
        print(
            f"B={B:4d} fill us: "
            + " ".join(f"{k}={v * 1e6:.0f}" for k, v in run.fill.items())
            + " | fill+apply us: "
            + " ".join(f"{k}={v * 1e6:.0f}" for k, v in run.fill_apply.items())
            + f" | floor={run.floor * 1e6:.0f}"
        )

        # ---- mask agreement, row by row, for the same prefix
        if not run.python_agrees:
            print(f"  !! python baselines disagree with llmserve's fill at B={B} (harness bug)")
            res.setdefault("harness_mismatch", []).append(B)
        for eng in OTHERS:
            a = agreement[eng]
            a["by_B"][B] = compare(
                env.vocab, run.masks["llmserve"], run.masks[eng], prefixes, rejected[eng], a["disagreements"], seen[eng]
            )
        print_agreement(agreement, B)

    finish_agreement(agreement, rejected)
    res["ratios"] = case_ratios(res)
    res["best_other_fill_apply"] = {B: best_other(res["fill_apply_s"][B]) for B in env.sizes}
    print("fastest other fill+apply by B:", res["best_other_fill_apply"])
    res["targets_met"] = {k: bool(pred(res["ratios"][k])) for k, _, pred in TARGETS}
    print("ratios:", {k: round(v, 3) for k, v in res["ratios"].items()})
    return res


def print_summaries(results: dict, quick: bool) -> None:
    print("\n## Targets (llmserve; quick run)" if quick else "\n## Targets (llmserve)")
    print(
        "| case | "
        + " | ".join(desc for _, desc, _ in TARGETS)
        + " | met | "
        + " | ".join(desc for _, desc in INFO)
        + " |"
    )
    print("|---|" + "---|" * (len(TARGETS) + 1 + len(INFO)))
    for name, res in results["cases"].items():
        cells = [f"{fmt_ratio(k, res['ratios'][k])} {'✓' if res['targets_met'][k] else '✗'}" for k, _, _ in TARGETS]
        met = sum(res["targets_met"].values())
        print(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {met}/{len(TARGETS)} | "
            + " | ".join(fmt_ratio(k, res["ratios"][k]) for k, _ in INFO)
            + " |"
        )

    print("\n## Compile (median ms) and B=256 timings (us)")
    print(
        "| case | llmserve | llmserve_full | xgrammar | llguidance | disk cache | fill ours/xgr/llg/py_loop/py_copy "
        "| fill+apply ours/xgr/llg/py_loop/py_copy/llg_torch | floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    engines = ("llmserve", "xgrammar", "llguidance", "python_loop", "python_row_copy")
    for name, res in results["cases"].items():
        c = res["compile_s"]
        f, fa = res["fill_s"][BIG], res["fill_apply_s"][BIG]
        print(
            f"| {name} | {c['llmserve'] * 1e3:.2f} | {c['llmserve_full'] * 1e3:.2f} | {c['xgrammar'] * 1e3:.2f} "
            f"| {c['llguidance'] * 1e3:.2f} | {c['llmserve_disk_cache_first_fill'] * 1e3:.3f} "
            f"| {' / '.join(f'{f[e] * 1e6:.0f}' for e in engines)} "
            f"| {' / '.join(f'{fa[e] * 1e6:.0f}' for e in (*engines, 'llguidance_torch'))} "
            f"| {res['floor_s'][BIG] * 1e6:.0f} |"
        )

    print("\n## fill+apply by batch size (us): ours / fastest other (which) / floor")
    print("| case | " + " | ".join(f"B={B}" for B in results["sizes"]) + " |")
    print("|---|" + "---|" * len(results["sizes"]))
    for name, res in results["cases"].items():
        cells = []
        for B in results["sizes"]:
            fa, other = res["fill_apply_s"][B], res["best_other_fill_apply"][B]
            cells.append(
                f"{fa['llmserve'] * 1e6:.1f} / {fa[other] * 1e6:.1f} ({other}) / {res['floor_s'][B] * 1e6:.1f}"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")

    print(
        f"\n## Mask agreement with llmserve (rows identical at B={BIG}; distinct disagreeing prefixes; "
        "prefixes the engine rejected)"
    )
    print("| case | engine | rows agree | disagreeing prefixes | rejected prefixes |")
    print("|---|---|---|---|---|")
    for name, res in results["cases"].items():
        for eng in OTHERS:
            a = res["agreement"][eng]
            s = a["by_B"][BIG]
            print(f"| {name} | {eng} | {s['agree']}/{s['rows']} | {len(a['disagreements'])} | {len(a['rejections'])} |")


def optional_properties_schema(n: int) -> dict:
    """n optional properties of mixed types (issue #11: 25 of them took 63 s before compilation
    became linear in the number of optional properties)."""
    kinds = ({"type": ["integer", "null"]}, {"type": "string", "maxLength": 8}, {"type": "boolean"})
    return {"type": "object", "properties": {f"field_{i}": kinds[i % 3] for i in range(n)}}


# Constraints that used to take the server down (issue #11), compiled cold: the optional-property
# schema must compile in under 100 ms; the others must be refused within their budget.
HOSTILE = {
    "optional_64": ({"json_schema": optional_properties_schema(64)}, "compiles < 100 ms"),
    "regex_(x?){1000}": ({"regex": "((a|b|c|d|e|f|g|h)?){1000}"}, "refused: time budget"),
    "ref_fan_out_4^11": (
        {
            "json_schema": {
                "$defs": {
                    **{
                        f"L{i}": {
                            "type": "object",
                            "properties": {k: {"$ref": f"#/$defs/L{i + 1}"} for k in "abcd"},
                            "required": list("abcd"),
                        }
                        for i in range(11)
                    },
                    "L11": {"type": "integer"},
                },
                "$ref": "#/$defs/L0",
            }
        },
        "refused: expanded size or state limit, well within the time budget",
    ),
}


def measure_hostile(vocab: Vocab, cache_root: Path, runs: int) -> dict[str, dict]:
    """Cold compile (empty cache folder, memo cleared) up to the first mask, median of ``runs``."""
    out: dict[str, dict] = {}
    for name, (spec_obj, expect) in HOSTILE.items():
        times, outcome = [], ""
        for k in range(runs):
            clear_memo()
            folder = cache_root / f"hostile-{name}-{k}"
            t = time.perf_counter()
            try:
                c = compile_constraint(spec_obj, vocab, cache_dir=folder)
                c.allowed(c.start)
                outcome = f"compiled, {c.num_states} states"
            except ConstraintError as exc:
                outcome = f"refused: {exc.message}"
            times.append((time.perf_counter() - t) * 1000)
        out[name] = {"ms": statistics.median(times), "outcome": outcome, "expect": expect}
        print(f"hostile {name}: {out[name]['ms']:.1f} ms, {outcome} (target: {expect})")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-hostile", action="store_true", help="leave out the hostile compiles (~7 s)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    cache_root = Path(tempfile.mkdtemp(prefix="llmserve-bench-cache-"))
    env = setup(args.quick, cache_root)
    results: dict[str, Any] = {
        "vocab": env.V,
        "threads": native.pool_size(),
        "quick": args.quick,
        "lazy_masks": hasattr(CompiledConstraint, "complete"),
        "sizes": list(env.sizes),
        "cases": {},
    }
    try:
        for name, (spec_obj, sample) in CASES.items():
            results["cases"][name] = run_case(env, name, spec_obj, sample)
        if not args.skip_hostile:
            print("\n== hostile constraints (issue #11)")
            results["hostile"] = measure_hostile(env.vocab, cache_root, 3)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)

    print_summaries(results, args.quick)
    results["total_s"] = time.perf_counter() - t0
    print(f"\ntotal {results['total_s']:.1f}s")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
