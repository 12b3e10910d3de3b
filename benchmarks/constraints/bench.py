"""Constraint processor benchmark on a real 100k vocabulary (cl100k_base from the npm package
js-tiktoken, MIT, fetched with `npm pack` into a cache outside the repository).

Measures, side by side in one run, for a 5-field JSON schema, an ISO-date regex, an e-mail regex and
a 5-way choice: compile time (cold, and from the on-disk cache), per-step mask fill for
B = 1, 8, 32, 128, 256 rows at different states, and fill+apply on a [B, V] float32 logits tensor;
for llmserve (C++ core), xgrammar (BatchGrammarMatcher), llguidance (fill_next_token_bitmask_par)
and a pure-Python per-request loop; plus the memory floor (one read + one write of [B, V] float32).

    python benchmarks/constraints/bench.py [--out results.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from llmserve.constraints import Vocab, compile_constraint, load_cached
from llmserve.constraints.compiled import ConstraintSpec, native, native_vocab

CACHE = Path(os.environ.get("LLMSERVE_BENCH_CACHE", Path.home() / ".cache" / "llmserve-bench"))
JS_TIKTOKEN = "js-tiktoken@1.0.21"
SIZES = (1, 8, 32, 128, 256)

SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "failed", "pending"]},
        "count": {"type": "integer"},
        "valid": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "owner": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"]},
    },
    "required": ["status", "count", "valid", "tags", "owner"],
}
DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
EMAIL = r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}"
CHOICES = ["positive", "negative", "neutral", "mixed", "unknown"]
CASES = {
    "json_schema": ({"json_schema": SCHEMA},
                    '{"status":"ok","count":42,"valid":true,"tags":["a","bc"],"owner":{"name":"Jo é","age":3}}'),
    "iso_date": ({"regex": DATE}, "2024-05-17"),
    "email": ({"regex": EMAIL}, "john.doe@example.com"),
    "choice5": ({"choice": CHOICES}, "neutral"),
}


def cl100k_vocab() -> Vocab:
    ranks = CACHE / "cl100k_base.js"
    if not ranks.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["npm", "pack", JS_TIKTOKEN, "--silent", "--pack-destination", tmp], check=True,
                           capture_output=True, timeout=300)
            tgz = next(Path(tmp).glob("js-tiktoken-*.tgz"))
            with tarfile.open(tgz) as tf:
                member = tf.getmember("package/dist/ranks/cl100k_base.js")
                ranks.write_bytes(tf.extractfile(member).read())
    text = ranks.read_text()
    text = text[text.index("{"): text.rindex("}") + 1]  # `export default {...};`
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import llguidance as llg
    import llguidance.numpy as lnp
    import xgrammar as xgr

    t = time.perf_counter()
    vocab = cl100k_vocab()
    V = vocab.size
    nv = native_vocab(vocab)
    prep = time.perf_counter() - t
    byte_ids = byte_token_ids(vocab)
    eos = vocab.eos_ids[0]
    print(f"vocabulary cl100k_base: {V} tokens, eos {eos}; preparation {prep:.2f}s; threads {native.pool_size()}")

    tokens_bytes = [t if t is not None else b"" for t in vocab.tokens]
    xinfo = xgr.TokenizerInfo(tokens_bytes, xgr.VocabType.RAW, vocab_size=V, stop_token_ids=[eos])

    class _G:
        eos_token_id = eos
        bos_token_id = None
        tokens = tokens_bytes
        special_token_ids = [i for i, t in enumerate(vocab.tokens) if t is None]

        def __call__(self, s):
            data = s if isinstance(s, bytes) else s.encode()
            return [byte_ids[b] for b in data]

    lltok = llg.LLTokenizer(llg.TokenizerWrapper(_G()))
    executor = lnp.LLExecutor()
    cache_dir = Path(tempfile.mkdtemp(prefix="llmserve-bench-cache-"))
    reps_small, reps_big = (5, 3) if args.quick else (30, 10)
    results = {"vocab": V, "threads": native.pool_size(), "cases": {}}

    for name, (spec_obj, sample) in CASES.items():
        print(f"\n== {name}")
        spec = ConstraintSpec(*next(iter(spec_obj.items())))
        res = results["cases"][name] = {"compile_s": {}, "fill_s": {}, "fill_apply_s": {}, "floor_s": {}}
        # ---- compile
        t = time.perf_counter()
        ours = compile_constraint(spec, vocab, cache_dir=cache_dir)
        res["compile_s"]["llmserve"] = time.perf_counter() - t
        res["compile_s"]["llmserve_disk_cache"] = timeit(lambda: load_cached(spec, vocab, cache_dir), 20)
        xcomp = xgr.GrammarCompiler(xinfo, max_threads=native.pool_size(), cache_enabled=False)
        t = time.perf_counter()
        if spec.kind == "json_schema":
            xg = xcomp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
        elif spec.kind == "regex":
            xg = xcomp.compile_regex(spec.value)
        else:
            xg = xcomp.compile_regex("(" + "|".join(CHOICES) + ")")
        res["compile_s"]["xgrammar"] = time.perf_counter() - t
        if spec.kind == "json_schema":
            lgram = llg.grammar_from("json_schema", json.dumps({**SCHEMA, "x-guidance": {"whitespace_flexible": False}}))
        elif spec.kind == "regex":
            lgram = llg.grammar_from("regex", spec.value)
        else:
            lgram = llg.grammar_from("regex", "(" + "|".join(CHOICES) + ")")
        t = time.perf_counter()
        lm0 = llg.LLMatcher(lltok, lgram)
        lm0_mask = np.zeros((1, (V + 31) // 32), np.int32)
        lnp.fill_next_token_bitmask_par(executor, [(lm0, 0)], lm0_mask)  # first mask: llguidance is lazy
        res["compile_s"]["llguidance"] = time.perf_counter() - t
        print("compile ms:", {k: round(v * 1e3, 3) for k, v in res["compile_s"].items()})

        sample_ids = [byte_ids[b] for b in sample.encode()]
        for B in SIZES if not args.quick else (1, 8, 256):
            prefixes = [sample_ids[: (r * 7) % len(sample_ids)] for r in range(B)]
            reps = reps_small if B <= 32 else reps_big
            # ours: rows at different states
            batch = native.Batch(nv)
            lists = [list(p) for p in prefixes]
            for r in range(B):
                batch.set_row(r, ours.native, lists[r])
            batch.sync(B)
            W = (V + 31) // 32
            bm = np.zeros((B, W), np.uint32)
            logits0 = torch.randn(B, V)
            logits = logits0.clone()
            lnp_ = logits.numpy()

            def ours_fill():
                batch.sync(B)
                batch.fill(bm)

            def ours_fill_apply():
                batch.sync(B)
                batch.fill_apply(lnp_)

            # xgrammar
            xms = []
            for p in prefixes:
                m = xgr.GrammarMatcher(xg)
                for tok in p:
                    if not m.accept_token(tok):  # xgrammar disagrees with the byte walk: stay here
                        break
                xms.append(m)
            xbm = xgr.allocate_token_bitmask(B, V)
            xbatch = xgr.BatchGrammarMatcher(max_threads=native.pool_size())

            def x_fill():
                xbatch.batch_fill_next_token_bitmask(xms, xbm)

            def x_fill_apply():
                xbatch.batch_fill_next_token_bitmask(xms, xbm)
                xgr.apply_token_bitmask_inplace(logits, xbm)

            # llguidance
            lms = []
            for p in prefixes:
                m = llg.LLMatcher(lltok, lgram)
                for tok in p:
                    if not m.consume_token(tok):
                        break
                lms.append(m)
            lbm = np.zeros((B, W), np.int32)
            pairs = [(m, i) for i, m in enumerate(lms)]

            def l_fill():
                lnp.fill_next_token_bitmask_par(executor, pairs, lbm)

            def l_fill_apply():
                lnp.fill_next_token_bitmask_par(executor, pairs, lbm)
                lnp.apply_token_bitmask_inplace(lnp_, lbm)

            # pure-Python per-request loop (same compiled masks; Python walks the DFA per request)
            # (one step per request: advance by the newest token in Python, copy that state's mask row)
            masks = ours.masks
            base = [ours.walk(lst[:-1]) for lst in lists]

            def py_fill():
                for r in range(B):
                    s = ours.step(base[r], lists[r][-1]) if lists[r] else base[r]
                    bm[r] = masks[s if s >= 0 else ours.num_states]

            neg = float("-inf")

            def py_fill_apply():
                py_fill()
                bits = np.unpackbits(bm.view(np.uint8), axis=1, bitorder="little")[:, :V]
                for r in range(B):
                    lnp_[r][bits[r] == 0] = neg

            def floor():
                np.multiply(lnp_, 1.0, out=lnp_)

            def floor_torch():
                logits.mul_(1.0)

            fill = {"llmserve": timeit(ours_fill, reps), "xgrammar": timeit(x_fill, reps),
                    "llguidance": timeit(l_fill, reps), "python_loop": timeit(py_fill, max(1, reps // 3), 1)}
            fa = {"llmserve": timeit(ours_fill_apply, reps), "xgrammar": timeit(x_fill_apply, reps),
                  "llguidance": timeit(l_fill_apply, reps),
                  "python_loop": timeit(py_fill_apply, max(1, reps // 3), 1)}
            fl = min(timeit(floor, reps), timeit(floor_torch, reps))
            res["fill_s"][B], res["fill_apply_s"][B], res["floor_s"][B] = fill, fa, fl
            # correctness spot check: our mask equals xgrammar's on allowed tokens of row 0's state
            print(f"B={B:4d} fill us: " + " ".join(f"{k}={v * 1e6:.0f}" for k, v in fill.items())
                  + " | fill+apply us: " + " ".join(f"{k}={v * 1e6:.0f}" for k, v in fa.items())
                  + f" | floor={fl * 1e6:.0f}")
        # ratios vs the targets
        big = 256
        fa256 = res["fill_apply_s"][big]
        res["ratios"] = {
            "fill_apply_B256_over_floor": fa256["llmserve"] / res["floor_s"][big],
            "fill_apply_B256_vs_best_other": fa256["llmserve"] / min(v for k, v in fa256.items() if k != "llmserve"),
            "per_row_fill_B256_over_B8": (res["fill_s"][256]["llmserve"] / 256) / (res["fill_s"][8]["llmserve"] / 8),
            "python_loop_over_llmserve_fill_B256": res["fill_s"][256]["python_loop"] / res["fill_s"][256]["llmserve"],
            "compile_over_fastest": res["compile_s"]["llmserve"] / min(
                res["compile_s"]["xgrammar"], res["compile_s"]["llguidance"], res["compile_s"]["llmserve"]),
            "disk_cache_compile_ms": res["compile_s"]["llmserve_disk_cache"] * 1e3,
        }
        print("ratios:", {k: round(v, 3) for k, v in res["ratios"].items()})
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
