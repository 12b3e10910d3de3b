"""A hung engine fails the liveness check (#13, self-healing): `llmserve serve` on the embedded vLLM engine, whose
engine-core process is stopped (SIGSTOP: alive, answering nothing, as a deadlocked or stuck core would be).

The server pings its engine core (llmserve.serve.server.watch_engine); a core that does not answer within the stall
timeout turns /health (the route the Kubernetes liveness probe reads) to 503 and ends the server with exit code 7,
so that a supervisor restarts it. A killed core ends it the same way (tests/serve/test_engine_survives.py).
"""

from __future__ import annotations

import signal
import time

import httpx
import psutil
import pytest

from llmserve.errors import ExitCode
from llmserve.serve.options import STALL_TIMEOUT_ENV
from llmserve.serve.server import ENGINE_PING_INTERVAL_S

MODEL = "tiny-chat"
STALL_S = 4.0
pytestmark = pytest.mark.timeout(1200)


def _engine_core(pid: int) -> psutil.Process:
    children = psutil.Process(pid).children(recursive=True)
    cores = [c for c in children if "EngineCore" in c.name() or "EngineCore" in " ".join(c.cmdline())]
    assert cores, [(c.pid, c.name(), c.cmdline()) for c in children]
    return cores[0]


def _health(srv) -> int | None:
    try:
        return httpx.get(srv.base_url + "/health", timeout=2).status_code
    except httpx.TransportError:
        return None


def test_a_hung_engine_fails_health_and_ends_the_server(tmp_path, tiny_vllm_package, server_control):
    log = tmp_path / "server.log"
    srv = server_control.start(
        tiny_vllm_package, log, api_key=None, env_extra={STALL_TIMEOUT_ENV: str(STALL_S)}, ready_timeout=840
    )
    core = _engine_core(srv.proc.pid)
    try:
        # a working engine answers its pings: still healthy after several of them, and still serving
        time.sleep(2 * ENGINE_PING_INTERVAL_S + 1)
        assert _health(srv) == 200
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
        assert httpx.post(srv.base_url + "/v1/completions", json=body, timeout=120).status_code == 200
        assert srv.proc.poll() is None

        core.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        failed_at = None
        while srv.proc.poll() is None and time.monotonic() - stopped_at < 120:
            if failed_at is None and _health(srv) != 200:
                failed_at = time.monotonic()
            time.sleep(0.2)
        code = srv.proc.wait(30)
        assert code == ExitCode.ENGINE, srv.log_text()[-3000:]
        assert failed_at is not None
        # noticed at the first ping the core leaves unanswered for STALL_S: well before a liveness probe gives up
        assert failed_at - stopped_at < ENGINE_PING_INTERVAL_S + STALL_S + 5, failed_at - stopped_at
        text = srv.log_text()
        assert "the engine core has not answered for" in text, text[-3000:]
        assert f"exit code {ExitCode.ENGINE}" in text
        assert "ping failed" not in text
        # the server took its hung core with it
        core.wait(15)
    finally:
        if core.is_running():
            core.kill()
        server_control.stop(srv)
