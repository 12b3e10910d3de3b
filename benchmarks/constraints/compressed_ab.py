"""Compressed against dense mask rows (issue #17 item 4), in one process: the same constraint's
complete form as the engine holds it (compressed rows, byte-class automaton) and its dense form
(one packed row per state, int32[S, 256] automaton: what the core held before), in two batches
over the same rows, timed interleaved round by round next to the memory floor (one read and one
write of the [B, V] float32 logits, numpy or torch, whichever is faster). On a shared machine the
interleaving is what makes the ratio mean something; `ab_core.py` compares whole builds instead.

Rows: row r is a random walk of (7 r mod 40) allowed tokens from the start state (seeded), so a
batch holds rows at many different states, as in serving. Constraints: memory.py's six, over the
cl100k_base vocabulary of bench.py.

```
.venv/bin/python benchmarks/constraints/compressed_ab.py [--rounds 7] [--out ab.json]
```
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import cl100k_vocab
from memory import constraints

from llmserve.constraints import compile_constraint
from llmserve.constraints.native import native, native_vocab

SIZES = (1, 8, 256)
REPS = {1: 400, 8: 100, 256: 6}


def walks(c, dense: np.ndarray, vocab, B: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    allowed_in: dict[int, np.ndarray] = {}
    out = []
    for r in range(B):
        s, toks = c.start, []
        for _ in range((7 * r) % 40):
            if s not in allowed_in:
                bits = np.unpackbits(dense[s].view(np.uint8), bitorder="little")[: vocab.size].copy()
                bits[list(vocab.eos_ids)] = 0
                allowed_in[s] = np.flatnonzero(bits)
            allowed = allowed_in[s]
            if not allowed.size:
                break
            t = int(rng.choice(allowed))
            toks.append(t)
            s = c.step(s, t)
        out.append(toks)
    return out


def timed_calls(dense, compressed, bits: np.ndarray, logits: np.ndarray) -> dict:
    lt = torch.from_numpy(logits)
    return {
        "fill_dense": lambda: dense.fill(bits),
        "fill_compressed": lambda: compressed.fill(bits),
        "fill_apply_dense": lambda: dense.fill_apply(logits),
        "fill_apply_compressed": lambda: compressed.fill_apply(logits),
        "floor_numpy": lambda: np.multiply(logits, 1.0, out=logits),
        "floor_torch": lambda: lt.mul_(1.0),
    }


def per_call(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    vocab = cl100k_vocab()
    nv = native_vocab(vocab)
    V = vocab.size
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in constraints().items():
            c = compile_constraint(spec, vocab, cache_dir=Path(tmp)).complete()
            dense = c.masks  # expanded from the compressed rows, bit for bit the dense form
            gd = native.Grammar(nv, c.table, c.accept, dense, c.start, True)
            gc = c.native
            results[name] = {}
            for B in SIZES:
                rows = walks(c, dense, vocab, B, seed=B)
                batches = {}
                for side, g in (("dense", gd), ("compressed", gc)):
                    batch = native.Batch(nv)
                    for i, toks in enumerate(rows):
                        batch.set_row(i, g, list(toks))
                    batch.sync(B)
                    batches[side] = batch
                logits = np.random.default_rng(0).standard_normal((B, V)).astype(np.float32)
                bits = np.zeros((B, vocab.words), np.uint32)
                check = {}
                for side, batch in batches.items():
                    batch.fill(bits)
                    check[side] = bits.copy()
                assert np.array_equal(check["dense"], check["compressed"])
                calls = timed_calls(batches["dense"], batches["compressed"], bits, logits)
                times: dict[str, list[float]] = {k: [] for k in calls}
                for k in range(args.rounds):
                    order = list(calls) if k % 2 == 0 else list(reversed(calls))
                    for key in order:
                        times[key].append(per_call(calls[key], REPS[B]))
                        logits[:] = 1.0  # -inf from the applies would make later passes cheaper
                floors = [min(a, b) for a, b in zip(times["floor_numpy"], times["floor_torch"], strict=True)]
                med = {k: statistics.median(v) for k, v in times.items()}
                ratio = statistics.median(
                    c_ / d_ for c_, d_ in zip(times["fill_apply_compressed"], times["fill_apply_dense"], strict=True)
                )
                results[name][B] = {
                    **{k: v * 1e6 for k, v in med.items()},
                    "floor_us": statistics.median(floors) * 1e6,
                    "fill_apply_compressed_over_dense": ratio,
                    "fill_compressed_over_dense": statistics.median(
                        c_ / d_ for c_, d_ in zip(times["fill_compressed"], times["fill_dense"], strict=True)
                    ),
                    "compressed_over_floor": statistics.median(
                        c_ / f for c_, f in zip(times["fill_apply_compressed"], floors, strict=True)
                    ),
                    "dense_over_floor": statistics.median(
                        d_ / f for d_, f in zip(times["fill_apply_dense"], floors, strict=True)
                    ),
                }
                print(f"{name} B={B} done", flush=True)
    print(
        "\n| constraint | B | fill us dense -> compressed (x) | fill+apply us dense -> compressed (x) "
        "| floor us | / floor dense -> compressed |"
    )
    print("|---|---|---|---|---|---|")
    for name, by_b in results.items():
        for B, r in by_b.items():
            print(
                f"| {name} | {B} | {r['fill_dense']:.1f} -> {r['fill_compressed']:.1f} "
                f"({r['fill_compressed_over_dense']:.2f}) | {r['fill_apply_dense']:.1f} -> "
                f"{r['fill_apply_compressed']:.1f} ({r['fill_apply_compressed_over_dense']:.2f}) "
                f"| {r['floor_us']:.1f} | {r['dense_over_floor']:.2f} -> {r['compressed_over_floor']:.2f} |"
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
