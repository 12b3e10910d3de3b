"""A worker process that records vLLM-named series in a Prometheus multiprocess folder, as an engine process does.

    python mp_writer.py FOLDER ENGINE [--hold]

Writes `vllm:prompt_tokens` (counter, +5), `vllm:time_to_first_token_seconds` (histogram, one 0.05 s observation),
`vllm:num_requests_running` (livesum gauge, 2), `vllm:kv_cache_usage_perc` (mostrecent gauge, 0.25), labelled
engine=ENGINE, then prints "ready" and either exits or, with --hold, stays alive until its stdin closes.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    folder, engine = sys.argv[1], sys.argv[2]
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder  # before prometheus_client is imported
    from prometheus_client import Counter, Gauge, Histogram

    labels = ["model_name", "engine"]
    Counter("vllm:prompt_tokens", "Prefill tokens", labels).labels("tiny", engine).inc(5)
    Histogram("vllm:time_to_first_token_seconds", "TTFT", labels, buckets=(0.01, 0.1, 1.0)).labels(
        "tiny", engine
    ).observe(0.05)
    Gauge("vllm:num_requests_running", "Running", labels, multiprocess_mode="livesum").labels("tiny", engine).set(2)
    Gauge("vllm:kv_cache_usage_perc", "KV use", labels, multiprocess_mode="mostrecent").labels("tiny", engine).set(0.25)
    print("ready", flush=True)
    if "--hold" in sys.argv:
        sys.stdin.read()
