"""Memory per compiled constraint (issue #17 item 4: within 4x of xgrammar's on the same constraints).

For each constraint, against the cl100k_base vocabulary of `bench.py`: llmserve's complete form as
the engine holds it (each distinct mask row once, in its smallest form, and the automaton as byte
classes: csrc/grammar.h, csrc/vocab_trie.h), what the dense form took (int32[S, 256] automaton and
one packed row of V bits per state), and xgrammar's compiled grammar
(`CompiledGrammar.memory_size_bytes`).

```
.venv/bin/python benchmarks/constraints/memory.py [--out memory.json]
```
"""

from __future__ import annotations

import argparse
import hashlib
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
    """The complete form as the engine holds it (compressed rows, the byte-class automaton as a
    comb; what the in-memory cache counts, ``CompiledConstraint.nbytes``) and what the dense form
    took before."""
    c = compile_constraint(spec, vocab, cache_dir=cache).complete()
    assert c.compressed_rows is not None and c.transitions is not None
    _row_of, _off, kind, _data = c.compressed_rows
    classes, comb = c.transitions
    S = c.num_states
    automaton = int(classes.nbytes + comb.nbytes + c.accept.nbytes)
    return {
        "states": S,
        "byte_classes": int(classes.max()) + 1,
        "distinct_rows": int(kind.shape[0]),
        "row_kinds": {
            k: int(np.count_nonzero(kind == i)) for i, k in enumerate(("words", "allowed", "refused", "dense", "delta"))
        },
        "bytes": c.nbytes,
        # less the large rows it names that are held once per process for every form over the
        # vocabulary (shared_rows.py): a lower bound, reached where other forms hold all of them
        "private_bytes": c.private_nbytes,
        # those rows by content (their bytes), so that a sample can share them out among its forms
        "shared_rows": {
            hashlib.blake2b(words.tobytes(), digest_size=16).hexdigest(): int(words.nbytes)
            for _, words in (c.native.shared_rows or ())
        },
        "automaton_bytes": automaton,
        "rows_bytes": c.nbytes - automaton,
        # before: int32[S, 256] automaton and one packed row of V bits per state (+ the dead row)
        "dense_bytes": S * 256 * 4 + S + (S + 1) * vocab.words * 4,
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
        "| constraint | states | byte classes | distinct rows (words/allowed/refused/dense/delta) | dense MB "
        "| llmserve MB | of it automaton MB | xgrammar MB | dense / xgr | llmserve / xgr |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    mb = 1 << 20
    for name, r in results.items():
        x = r["xgrammar_bytes"]
        k = r["row_kinds"]
        print(
            f"| {name} | {r['states']} | {r['byte_classes']} | {r['distinct_rows']} / {r['states'] + 1} "
            f"({k['words']}/{k['allowed']}/{k['refused']}/{k['dense']}/{k['delta']}) | {r['dense_bytes'] / mb:.2f} "
            f"| {r['bytes'] / mb:.3f} | {r['automaton_bytes'] / mb:.3f} | {x / mb:.3f} "
            f"| {r['dense_bytes'] / x:.1f} | {r['bytes'] / x:.2f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
