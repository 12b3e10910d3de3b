"""Memory per compiled constraint (issue #17 item 4: within 4x of xgrammar's on the same constraints).

For each constraint, against the cl100k_base vocabulary of `bench.py`: llmserve's complete form
(automaton + one packed mask row per state), how much of it is distinct rows, and how small it would
be with shared rows (one copy of each distinct row plus a row index per state) or with rows stored
sparsely (only the words that are neither all-allowed nor all-refused), next to xgrammar's compiled
grammar (`CompiledGrammar.memory_size_bytes`). It measures; it changes nothing.

```
.venv/bin/python benchmarks/constraints/memory.py [--out memory.json]
```
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import CASES, cl100k_vocab

from llmserve.constraints import compile_constraint

ORDER_12 = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
        "status": {"type": "string", "enum": ["new", "paid", "shipped", "delivered", "cancelled"]},
        "created": {"type": "string", "format": "date-time"},
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"}},
            "required": ["name", "email"],
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
                "required": ["sku", "qty", "price"],
            },
            "maxItems": 20,
        },
        "total": {"type": "number"},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
        "paid": {"type": "boolean"},
        "notes": {"type": ["string", "null"]},
        "shipping": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "city", "zip"],
        },
        "coupon": {"type": "string", "maxLength": 12},
        "priority": {"type": "integer", "minimum": 0, "maximum": 5},
    },
    "required": ["order_id", "status", "created", "customer", "items", "total", "currency", "paid"],
}
BRANDS = ["Acme", "Nordlys", "Kestrel", "Vantor", "Quilla", "Brio", "Solenne", "Taro", "Ymir", "Halcyon"]
THINGS = ["kettle", "lamp", "chair", "mug", "backpack", "speaker", "blanket", "desk", "jacket", "watch"]


def products(n: int = 200) -> list[str]:
    """Product names as a catalogue has them: brand, kind and a model code, few shared suffixes."""
    rng = np.random.default_rng(200)
    codes = np.frombuffer(b"ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", dtype=np.uint8)
    names: set[str] = set()
    while len(names) < n:
        code = bytes(rng.choice(codes, int(rng.integers(3, 7)))).decode()
        names.add(f"{BRANDS[rng.integers(10)]} {THINGS[rng.integers(10)]} {code}")
    return sorted(names)


def constraints() -> dict[str, dict]:
    out = {name: spec for name, (spec, _) in CASES.items()}
    out["order_schema_12"] = {"json_schema": ORDER_12}
    out["choice_200"] = {"choice": products()}
    return out


def xgrammar_bytes(vocab, name: str, spec: dict) -> int | None:
    import xgrammar as xgr

    tokens = [t if t is not None else b"" for t in vocab.tokens]
    info = xgr.TokenizerInfo(tokens, xgr.VocabType.RAW, vocab_size=vocab.size, stop_token_ids=[vocab.eos_ids[0]])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    kind, value = next(iter(spec.items()))
    if kind == "json_schema":
        g = compiler.compile_json_schema(json.dumps(value), any_whitespace=False, separators=(",", ":"))
    elif kind == "regex":
        g = compiler.compile_regex(value)
    else:
        g = compiler.compile_regex("(" + "|".join(json.dumps(c)[1:-1] for c in value) + ")")
    return int(g.memory_size_bytes)


def ours(vocab, spec: dict, cache: Path) -> dict:
    c = compile_constraint(spec, vocab, cache_dir=cache).complete()
    masks = c.masks
    rows = masks.shape[0]
    unique = {row.tobytes(): row for row in masks}
    distinct = len(unique)
    partial_words = int(np.count_nonzero((masks != 0) & (masks != 0xFFFFFFFF)))
    distinct_rows = np.stack(list(unique.values()))
    distinct_partial = int(np.count_nonzero((distinct_rows != 0) & (distinct_rows != 0xFFFFFFFF)))
    bitmap = (masks.shape[1] + 7) // 8
    # per distinct row the smallest of: its sparse words, the ids it allows, the ids it refuses
    allowed = np.unpackbits(distinct_rows.view(np.uint8), axis=1).sum(axis=1, dtype=np.int64)
    partial_per_row = np.count_nonzero((distinct_rows != 0) & (distinct_rows != 0xFFFFFFFF), axis=1)
    adaptive = np.minimum(partial_per_row * 8 + bitmap, np.minimum(allowed, vocab.size - allowed) * 4)
    automaton = int(c.table.nbytes + c.accept.nbytes)
    return {
        "states": c.num_states,
        "bytes": int(masks.nbytes) + automaton,
        "mask_bytes": int(masks.nbytes),
        "automaton_bytes": automaton,
        "distinct_rows": distinct,
        "shared_rows_bytes": distinct * masks.shape[1] * 4 + rows * 4 + automaton,
        # a sparse row: (word index, word) pairs for its partial words, plus one bit per word
        # telling all-allowed from all-refused
        "sparse_bytes": partial_words * 8 + rows * bitmap + automaton,
        # both: each distinct row once, sparse
        "shared_sparse_bytes": distinct_partial * 8 + distinct * bitmap + rows * 4 + automaton,
        "shared_adaptive_bytes": int(adaptive.sum()) + rows * 4 + automaton,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    vocab = cl100k_vocab()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in constraints().items():
            r = ours(vocab, spec, Path(tmp))
            r["xgrammar_bytes"] = xgrammar_bytes(vocab, name, spec)
            results[name] = r
    print(f"vocabulary: {vocab.size} tokens\n")
    print(
        "| constraint | states | llmserve MB | of it automaton MB | distinct rows | shared MB | shared+sparse MB | shared+adaptive MB "
        "| xgrammar MB | llmserve / xgr | shared / xgr | shared+sparse / xgr | shared+adaptive / xgr |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    mb = 1 << 20
    for name, r in results.items():
        x = r["xgrammar_bytes"]
        forms = ("bytes", "shared_rows_bytes", "shared_sparse_bytes", "shared_adaptive_bytes")
        print(
            f"| {name} | {r['states']} | {r['bytes'] / mb:.2f} | {r['automaton_bytes'] / mb:.2f} "
            f"| {r['distinct_rows']} / {r['states'] + 1} | "
            + " | ".join(f"{r[k] / mb:.2f}" for k in forms[1:])
            + f" | {x / mb:.2f} | "
            + " | ".join(f"{r[k] / x:.1f}" for k in forms)
            + " |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
