"""SIGTERM drains in-flight requests and exits 0 (its own short-lived server, no API key)."""

from __future__ import annotations

import signal
import threading
import time

import httpx


def test_sigterm_drains_in_flight_requests_and_exits_zero(tmp_path, tiny_vllm_package, server_control):
    srv = server_control.start(tiny_vllm_package, tmp_path / "server.log", api_key=None)
    try:
        results = {}

        def call(i):
            r = httpx.post(
                srv.base_url + "/v1/completions",
                timeout=120,
                json={"model": "tiny-chat", "prompt": f"drain {i}", "max_tokens": 300, "ignore_eos": True},
            )
            results[i] = r

        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until the engine is working on them
            m = httpx.get(srv.base_url + "/metrics").text
            if any(
                line.startswith("vllm:num_requests_running") and not line.endswith(" 0.0") for line in m.splitlines()
            ):
                break
            time.sleep(0.05)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # Draining: no new connections are accepted.
        try:
            refused = httpx.get(srv.base_url + "/health", timeout=2).status_code == 503
        except httpx.TransportError:
            refused = True
        assert refused
        for t in threads:
            t.join(120)
        assert srv.proc.wait(90) == 0, srv.log_text()[-3000:]
        for r in results.values():
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 300
        assert len(results) == 3
        assert "draining in-flight requests" in srv.log_text()
    finally:
        server_control.stop(srv)
