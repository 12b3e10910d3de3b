#!/usr/bin/env python
"""One merged scrape (8 worker processes' multiprocess files + a real Triton endpoint) against scraping each source
alone, in the same run. Target (issue #16): merged < 1.2x the slower single source.

What is timed, interleaved round by round:
  triton     GET Triton's /metrics and read the body (what a scraper of Triton alone pays)
  vllm       MultiProcessCollector on a fresh registry + generate_latest over the folder (what vLLM's own /metrics
             does; dead-writer checks not included)
  merged     MergedMetrics([Multiprocess(folder), TritonScrape(url)]).render(None): both sources (Triton fetched on
             a worker thread while the folder is read), de-duplication, the merger's own families, text format
  merged_om  the same, rendered as OpenMetrics (Triton's families are parsed for that format)

The 8 workers stay alive (as engine processes would) and write vLLM's shape of series: 20 counters, 6 gauges
(livesum and mostrecent) and 17 histograms with vLLM's bucket counts, labelled model_name and engine. Triton
serves 4 echo models and one that bridges 3 vllm:* families (shadowed by the folder's in the merge).

Usage:
    .venv/bin/python benchmarks/metrics/run.py [--rounds 300] [--workers 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

COUNTERS = [
    "prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits", "external_prefix_cache_queries",
    "external_prefix_cache_hits", "mm_cache_queries", "mm_cache_hits", "num_preemptions", "prompt_tokens_by_source",
    "prompt_tokens_cached", "prompt_tokens_cached_by_source", "request_success", "admission_rejections",
    "estimated_flops_per_gpu", "estimated_read_bytes_per_gpu", "estimated_write_bytes_per_gpu", "corrupted_requests",
    "watermark_requests", "spec_decode_num_drafts",
]  # fmt: skip
GAUGES = [
    ("num_requests_running", "livesum"), ("num_requests_waiting", "livesum"), ("kv_cache_usage_perc", "mostrecent"),
    ("engine_sleep_state", "mostrecent"), ("num_requests_waiting_by_reason", "livesum"),
    ("cache_config_info", "mostrecent"),
]  # fmt: skip
LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
           80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
HISTOGRAMS = [
    ("time_to_first_token_seconds", LATENCY), ("inter_token_latency_seconds", LATENCY),
    ("request_time_per_output_token_seconds", LATENCY), ("e2e_request_latency_seconds", LATENCY),
    ("request_queue_time_seconds", LATENCY), ("request_inference_time_seconds", LATENCY),
    ("request_prefill_time_seconds", LATENCY), ("request_decode_time_seconds", LATENCY),
    ("request_prompt_tokens", TOKENS), ("request_generation_tokens", TOKENS), ("iteration_tokens_total", TOKENS),
    ("request_max_num_generation_tokens", TOKENS), ("request_params_n", TOKENS), ("request_params_max_tokens", TOKENS),
    ("request_num_preemptions", TOKENS), ("request_prefill_kv_computed_tokens", TOKENS),
    ("kv_block_lifetime_seconds", LATENCY),
]  # fmt: skip

ECHO_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
ECHO_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.families = []
        self.metrics = []
        if args["model_name"] == "bridge":
            for name, kind in (
                ("vllm:prompt_tokens_total", pb_utils.MetricFamily.COUNTER),
                ("vllm:generation_tokens_total", pb_utils.MetricFamily.COUNTER),
                ("vllm:num_requests_running", pb_utils.MetricFamily.GAUGE),
            ):
                family = pb_utils.MetricFamily(name=name, description="bridged", kind=kind)
                self.families.append(family)  # a family must outlive its metrics
                self.metrics.append(family.Metric(labels={"model": "bridge", "version": "1"}))

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""


def worker(folder: str, engine: int, ready, stop) -> None:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder  # before prometheus_client is imported
    from prometheus_client import Counter, Gauge, Histogram

    labels = ["model_name", "engine"]
    for i, name in enumerate(COUNTERS):
        Counter(f"vllm:{name}", name, labels).labels("tiny-chat", str(engine)).inc(100 + i)
    for name, mode in GAUGES:
        Gauge(f"vllm:{name}", name, labels, multiprocess_mode=mode).labels("tiny-chat", str(engine)).set(engine)
    for name, buckets in HISTOGRAMS:
        h = Histogram(f"vllm:{name}", name, labels, buckets=buckets).labels("tiny-chat", str(engine))
        for v in (0.003, 0.05, 0.3, 3.0, 30.0, 300.0):
            h.observe(v)
    ready.set()
    stop.wait()


def start_triton(root: Path):
    from llmserve.serve.triton import TritonServer

    repo = root / "repository"
    names = ["echo0", "echo1", "echo2", "echo3", "bridge"]
    for name in names:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ECHO_CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(ECHO_MODEL))
    env = Path(os.environ.get("LLMSERVE_TRITON_ENV") or REPO / ".venv-triton")
    return TritonServer(repo, names, python_env=env, stop_timeout=20).start()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    from llmserve.metrics import MergedMetrics, Multiprocess, TritonScrape

    root = Path(tempfile.mkdtemp(prefix="llmserve-metrics-bench-"))
    folder = root / "multiproc"
    folder.mkdir()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs, readies = [], []
    for engine in range(args.workers):
        ready = ctx.Event()
        proc = ctx.Process(target=worker, args=(str(folder), engine, ready, stop))
        proc.start()
        procs.append(proc)
        readies.append(ready)
    for ready in readies:
        assert ready.wait(120), "a worker did not start"
    triton = start_triton(root)
    try:
        url = triton.metrics_url

        def triton_alone() -> bytes:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.read()

        def vllm_alone() -> bytes:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(folder))
            return generate_latest(registry)

        merged = MergedMetrics([Multiprocess(folder), TritonScrape(url, timeout=5)])
        cases = {
            "triton": triton_alone,
            "vllm": vllm_alone,
            "merged": lambda: merged.render(None),
            "merged_om": lambda: merged.render("application/openmetrics-text; version=1.0.0"),
        }
        sizes = {
            "triton": len(triton_alone()),
            "vllm": len(vllm_alone()),
            "merged": len(merged.render(None)[0]),
            "db_files": len(list(folder.glob("*.db"))),
        }
        for _ in range(20):  # warm-up: connections, imports, page caches
            for fn in cases.values():
                fn()
        times: dict[str, list[float]] = {name: [] for name in cases}
        for i in range(args.rounds):
            order = list(cases.items())
            order = order[i % len(order) :] + order[: i % len(order)]  # each case takes each position in turn
            for name, fn in order:
                times[name].append(timed(fn))
        merged.close()
    finally:
        triton.stop()
        stop.set()
        for proc in procs:
            proc.join(30)

    summary = {
        name: {"median_ms": statistics.median(ts) * 1000, "p90_ms": statistics.quantiles(ts, n=10)[-1] * 1000}
        for name, ts in times.items()
    }
    slower = max(summary["triton"]["median_ms"], summary["vllm"]["median_ms"])
    ratios = {
        "merged / slower single source": summary["merged"]["median_ms"] / slower,
        "merged_om / slower single source": summary["merged_om"]["median_ms"] / slower,
        "merged / (triton + vllm)": summary["merged"]["median_ms"]
        / (summary["triton"]["median_ms"] + summary["vllm"]["median_ms"]),
    }
    print(f"{args.workers} workers ({sizes['db_files']} .db files), {args.rounds} rounds; page bytes: {sizes}")
    for name, s in summary.items():
        print(f"  {name:10s} median {s['median_ms']:7.2f} ms   p90 {s['p90_ms']:7.2f} ms")
    for name, r in ratios.items():
        print(f"  {name}: {r:.2f}")
    verdict = "met" if ratios["merged / slower single source"] < 1.2 else "NOT met"
    print(f"target merged < 1.2x the slower single source: {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, "summary": summary, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
