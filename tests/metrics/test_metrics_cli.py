"""`llmserve metrics serve` in front of a real Triton and a multiprocess folder, and `metrics tail` reading it."""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from real_sources import families
from support.cli import cli_argv, cli_env, run_cli, run_cli_json

from llmserve.errors import ExitCode


@pytest.fixture
def endpoint(triton, writers) -> Iterator[str]:
    """`llmserve metrics serve` on a free port; yields its metrics URL."""
    writers.run("0")
    proc = subprocess.Popen(
        cli_argv(
            "metrics",
            "serve",
            "--triton-url",
            triton.metrics_url.split("//")[1].split("/")[0],
            "--multiproc-dir",
            writers.folder,
            "--port",
            "0",
            "--timeout",
            "5",
        ),
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, f"metrics serve exited with {proc.poll()}"
            if "serving merged metrics on " in line:
                url = line.strip().rsplit(" ", 1)[-1]
        assert url is not None
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def get(url: str, accept: str | None = None) -> tuple[bytes, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.read(), r.headers["Content-Type"]


def test_metrics_serve_merges_triton_and_the_folder_in_both_formats(endpoint):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as strict_openmetrics

    body, content_type = get(endpoint)
    assert content_type.startswith("text/plain; version=0.0.4")
    fams = families(body)
    assert {"nv_inference_request_success", "vllm:prompt_tokens", "vllm:num_requests_waiting"} <= set(fams)
    up = {s.labels["source"]: s.value for s in fams["llmserve_metrics_source_up"].samples}
    assert up == {"multiprocess": 1.0, "triton": 1.0}

    body, content_type = get(endpoint, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert {f.name for f in strict_openmetrics(body.decode())} >= {"nv_inference_request_success", "vllm:prompt_tokens"}
    assert get(endpoint.replace("/metrics", "/health"))[0] == b'{"status": "ready"}'


def test_metrics_tail_once_reports_triton_traffic_in_the_window(endpoint, triton):
    stop = threading.Event()

    def load() -> None:
        client = httpclient.InferenceServerClient(triton.http_url)
        try:
            while not stop.is_set():
                inp = httpclient.InferInput("IN", [1], "BYTES")
                inp.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
                client.infer("echo", [inp])
        finally:
            client.close()

    thread = threading.Thread(target=load)
    thread.start()
    try:
        code, snapshot, out = run_cli_json("metrics", "tail", endpoint, "--once", "--interval", "1.5", timeout=120)
    finally:
        stop.set()
        thread.join(30)
    assert code == 0, out
    assert snapshot is not None
    echo = {row["endpoint"]: row for row in snapshot["endpoints"]}["triton/echo"]
    assert echo["requests_per_s"] > 0 and echo["error_rate"] == 0
    assert snapshot["sources_up"] == {"multiprocess": True, "triton": True}
    # the folder's writers are idle: their counters give no rate, their gauges are read as they are
    assert snapshot["tokens_in_per_s"] == 0 and snapshot["kv_cache_usage"] == 0.25
    assert 1.0 < snapshot["interval_s"] < 10


def test_metrics_tail_of_nothing_is_unavailable(dead_address):
    code, error, out = run_cli_json("metrics", "tail", dead_address, "--once", "--interval", "0.1")
    assert code == ExitCode.UNAVAILABLE, out
    assert error is not None and error["error"] == "unavailable" and dead_address in error["message"]


def test_metrics_serve_without_a_source_is_a_usage_error():
    r = run_cli("metrics", "serve", "--port", "0")
    assert r.returncode == ExitCode.INVALID_INPUT, r.stderr
    assert "--triton-url" in r.stderr


def test_metrics_tail_live_redraws_until_interrupted(endpoint):
    import signal

    proc = subprocess.Popen(
        cli_argv("metrics", "tail", endpoint, "--interval", "0.3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    time.sleep(3)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "tokens/s in" in out and "triton/echo" in out and "KV-cache usage" in out
