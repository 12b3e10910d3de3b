"""Before/after for a change to the native core: `bench.py` run alternately against two builds of
`_core`, in one session, so that both sides meet the same load on a shared machine.

Build the other core from a commit without touching the installed one, then compare:

```
git archive <commit> csrc CMakeLists.txt | tar -x -C /tmp/base
cmake -S /tmp/base -B /tmp/base/build -DCMAKE_BUILD_TYPE=Release \\
    -Dpybind11_DIR=$(.venv/bin/python -m pybind11 --cmakedir) -DPython_EXECUTABLE=.venv/bin/python
make -C /tmp/base/build -j2
.venv/bin/python benchmarks/constraints/ab_core.py --base /tmp/base/build/_core*.so [--rounds 3] [--out ab.json]
```

When the change also touches the Python side (llmserve/constraints), the base core needs the base
Python: `--base-tree` runs the base side on that tree's `llmserve` package instead of the installed
one (`git archive <commit> csrc CMakeLists.txt llmserve templates | tar -x -C /tmp/base`, build as
above, pass `--base-tree /tmp/base`); bench.py itself is this tree's on both sides.

`--new` defaults to the installed core; `--new-tree` does for the new side what `--base-tree` does
for the base one (a tree from `git archive HEAD ...`, so that uncommitted edits in the working
tree, someone else's included, reach neither side). Each round runs `bench.py --quick --skip-hostile` once per
side (the order alternates); the table gives medians over rounds of llmserve's fill and
fill+apply per batch size, new / base, and each side against the memory floor and against the
fastest other engine's kernel of its own run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import runpy
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OTHERS = ("xgrammar", "llguidance")


def best_other(times: dict[str, float]) -> str:
    """As bench.py's: the fastest other engine or other engine's kernel (not the Python loops)."""
    return min((k for k in times if k in OTHERS or k.startswith("llguidance")), key=times.__getitem__)


def run_with_core(core: str, bench_args: list[str], tree: str = "") -> None:
    """Import `core` as llmserve's `_core` before anything imports the installed one (and, with
    `tree`, llmserve itself from that source tree), then run bench.py."""
    if tree:
        # the editable install's finder would still hand out the working tree's modules
        sys.meta_path[:] = [f for f in sys.meta_path if "_editable" not in type(f).__module__]
        sys.path.insert(0, tree)
    if core:
        spec = importlib.util.spec_from_file_location("llmserve.constraints._core", core)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["llmserve.constraints._core"] = mod
    sys.argv = [str(HERE / "bench.py"), *bench_args]
    runpy.run_path(str(HERE / "bench.py"), run_name="__main__")


def one_run(core: str, out: Path, tree: str = "") -> dict:
    args = [sys.executable, __file__, "--as-core", core, "--tree", tree]
    args += ["--", "--quick", "--skip-hostile", "--out", str(out)]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Per case and B: medians over rounds of each side's times and its ratios."""
    table: dict = {}
    first = runs["new"][0]
    for case in first["cases"]:
        for B in first["sizes"]:
            key = str(B)
            row: dict = {}
            for side, results in runs.items():
                fa = [r["cases"][case]["fill_apply_s"][key] for r in results]
                fl = [r["cases"][case]["fill_s"][key]["llmserve"] for r in results]
                floor = [r["cases"][case]["floor_s"][key] for r in results]
                ours = [x["llmserve"] for x in fa]
                other = [(x[k], k) for x in fa for k in [best_other(x)]]
                row[side] = {
                    "fill_us": statistics.median(fl) * 1e6,
                    "fill_apply_us": statistics.median(ours) * 1e6,
                    "over_floor": statistics.median(o / f for o, f in zip(ours, floor, strict=True)),
                    "vs_best_other": statistics.median(o / v for o, (v, _) in zip(ours, other, strict=True)),
                    "best_other": sorted({k for _, k in other}),
                }
            row["fill_new_over_base"] = row["new"]["fill_us"] / row["base"]["fill_us"]
            row["fill_apply_new_over_base"] = row["new"]["fill_apply_us"] / row["base"]["fill_apply_us"]
            table.setdefault(case, {})[key] = row
    return table


def main() -> None:
    if "--as-core" in sys.argv:
        i = sys.argv.index("--as-core")
        sep = sys.argv.index("--")
        tree = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv[:sep] else ""
        run_with_core(sys.argv[i + 1], sys.argv[sep + 1 :], tree)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the _core shared library to compare against")
    ap.add_argument("--new", default="", help="another _core build (default: the installed one)")
    ap.add_argument("--base-tree", default="", help="a source tree whose llmserve the base side imports")
    ap.add_argument("--new-tree", default="", help="a source tree whose llmserve the new side imports")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    runs: dict[str, list[dict]] = {"base": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            order = ("base", "new") if k % 2 == 0 else ("new", "base")
            for side in order:
                core = args.base if side == "base" else args.new
                tree = args.base_tree if side == "base" else args.new_tree
                runs[side].append(one_run(core, Path(tmp) / f"{side}-{k}.json", tree))
                print(f"round {k + 1}/{args.rounds}: {side} done", flush=True)
    table = summarise(runs)
    print(
        "\n| case | B | fill us base -> new (x) | fill+apply us base -> new (x) | /floor base -> new "
        "| /fastest other base -> new (kernel) |"
    )
    print("|---|---|---|---|---|---|")
    for case, rows in table.items():
        for B, row in rows.items():
            b, n = row["base"], row["new"]
            print(
                f"| {case} | {B} | {b['fill_us']:.1f} -> {n['fill_us']:.1f} ({row['fill_new_over_base']:.2f}) "
                f"| {b['fill_apply_us']:.1f} -> {n['fill_apply_us']:.1f} ({row['fill_apply_new_over_base']:.2f}) "
                f"| {b['over_floor']:.2f} -> {n['over_floor']:.2f} "
                f"| {b['vs_best_other']:.2f} -> {n['vs_best_other']:.2f} ({', '.join(n['best_other'])}) |"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"table": table, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
