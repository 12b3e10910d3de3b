"""Server operations: startup sequence, health, metrics, plugins, CLI surface."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest


def test_health_said_not_ready_then_ready(server):
    import httpx

    assert server.saw_not_ready  # 503 was observed while the engine loaded
    assert httpx.get(server.base_url + "/health").json() == {"status": "ready"}


def test_startup_steps_logged_in_order_with_durations(server):
    log = server.log_text()
    steps = re.findall(r"startup: (\S+)\s+done in [0-9.]+ s", log)
    assert steps == ["environment", "package", "plugins", "metrics-dir", "listen", "engine"]
    assert "ready in" in log


def test_package_plugin_was_called_by_vllm(server, plugin_marker_dir):
    # vllm.general_plugins runs in every vLLM process: the server's and the engine core's.
    called = {p.name for p in plugin_marker_dir.iterdir()}
    assert f"called-{server.proc.pid}" in called
    assert len(called) >= 2


def test_metrics_merge_vllm_and_server_series(client, http, model_name):
    client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "m"}], max_tokens=2)
    text = http.get("/metrics").text
    assert re.search(r'^vllm:generation_tokens_total\{.*model_name="tiny-chat".*\} [1-9]', text, re.M)
    assert re.search(r'^llmserve_requests_total\{endpoint="chat",status="200"\} [1-9]', text, re.M)
    assert 'llmserve_startup_step_seconds{step="engine"}' in text
    assert re.search(r"^llmserve_ready 1\.0", text, re.M)


def test_serve_help_has_an_example_and_imports_no_engine():
    code = (
        "import sys; from llmserve.cli.app import app; from typer.testing import CliRunner; "
        "r = CliRunner().invoke(app, ['serve', '--help']); print(r.output); "
        "print('HEAVY' if {'vllm', 'torch', 'prometheus_client'} & set(sys.modules) else 'LIGHT')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "Example" in r.stdout and "llmserve serve" in r.stdout and "--api-key" in r.stdout
    assert r.stdout.strip().endswith("LIGHT")


def _sample(text: str, name: str, **labels) -> float:
    """Sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


@pytest.mark.parametrize(
    "endpoint,path,body,clients",
    [
        # 4 requests each asking for 8 x 480 tokens (8 is the server's default --max-n)
        (
            "completion",
            "/v1/completions",
            {"model": "tiny-chat", "prompt": "x", "max_tokens": 480, "ignore_eos": True, "n": 8},
            4,
        ),
        # KServe answers one text per request: 16 requests of 480 tokens
        (
            "kserve_http_generate",
            "/v2/models/tiny-chat/generate",
            {"text_input": "x", "parameters": {"max_tokens": 480, "ignore_eos": True}},
            16,
        ),
    ],
)
def test_a_non_streaming_request_is_aborted_when_its_client_disconnects(server, http, endpoint, path, body, clients):
    """The engine stops generating for clients that have gone, and each request is counted with
    status 499, instead of being generated to the end for nobody."""
    from concurrent.futures import ThreadPoolExecutor

    def settled(done=lambda text: True) -> str:  # metrics once nothing runs or waits any more, and done
        deadline = time.monotonic() + 30
        while True:
            text = http.get("/metrics").text
            idle = _sample(text, "vllm:num_requests_running") == 0 and _sample(text, "vllm:num_requests_waiting") == 0
            if (idle and done(text)) or time.monotonic() > deadline:
                return text
            time.sleep(0.1)

    def closed_in(text: str) -> float:
        return _sample(text, "llmserve_requests_total", endpoint=endpoint, status="499")

    def give_up(_) -> str:
        try:
            httpx.post(server.base_url + path, json=body, headers=server.headers(), timeout=httpx.Timeout(10, read=0.3))
        except httpx.ReadTimeout:
            return "gave up"
        return "answered"

    before = settled()
    full = 480 * body.get("n", 1) * clients  # tokens asked for: seconds of work on this CPU
    with ThreadPoolExecutor(clients) as pool:
        assert set(pool.map(give_up, range(clients))) == {"gave up"}
    # a request is counted when its handler ends, which may be a moment after the engine let it go
    after = settled(lambda text: closed_in(text) - closed_in(before) >= clients)
    generated = _sample(after, "vllm:generation_tokens_total") - _sample(before, "vllm:generation_tokens_total")
    closed = closed_in(after) - closed_in(before)
    assert closed == clients
    assert generated < full / 2, (generated, full)
