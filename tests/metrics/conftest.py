"""Fixtures over real sources (real_sources.py): a module-wide Triton, a multiprocess folder with its writers, a hung
and a dead address, and the one real `llmserve serve` on the tiny model these tests start."""

from __future__ import annotations

import importlib.util
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_sources import Writers, start_triton

from llmserve.serve.triton import TritonServer


@pytest.fixture(scope="module")
def triton(tmp_path_factory) -> Iterator[TritonServer]:
    server = start_triton(tmp_path_factory.mktemp("triton"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def writers(tmp_path) -> Iterator[Writers]:
    folder = tmp_path / "multiproc"
    folder.mkdir()
    w = Writers(folder)
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """HOST:PORT of a TCP server that accepts connections and never answers (a hung metrics endpoint)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        listener.close()


@pytest.fixture
def dead_address() -> str:
    """HOST:PORT where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _serve_helpers():
    """tests/serve/conftest.py's start_server/stop_server, loaded under a name of its own (a conftest module is
    not importable by name, and its fixtures stay out of this folder)."""
    path = Path(__file__).resolve().parents[1] / "serve" / "conftest.py"
    spec = importlib.util.spec_from_file_location("llmserve_tests_serve_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory, tiny_vllm_package):
    """One real `llmserve serve --openai` on the tiny model, with its metrics folder where the test can read it
    (holding a stale writer's files before the server starts).
    The only engine tests/metrics starts (a start takes about a minute on two shared cores)."""
    helpers = _serve_helpers()
    root = tmp_path_factory.mktemp("engine")
    folder = root / "multiproc"
    folder.mkdir()
    Writers(folder).run("stale")  # an earlier run's files: the server's startup must wipe them
    server = helpers.start_server(
        tiny_vllm_package, root / "server.log", api_key=None, args=("--metrics-dir", str(folder)), ready_timeout=600
    )
    server.metrics_dir = folder
    yield server
    assert helpers.stop_server(server) == 0, server.log_text()[-3000:]
