"""One real `llmserve serve --openai` for the whole test session (tiny model, API key, one plugin)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key-0123456789"
MODEL = "tiny-chat"
PLUGIN_MODULE = textwrap.dedent("""\
    import os


    def register():
        folder = os.environ.get("LLMSERVE_TEST_PLUGIN_MARKER")
        if folder:
            with open(os.path.join(folder, f"called-{os.getpid()}"), "w") as fh:
                fh.write("vllm.general_plugins")
    """)
MANIFEST = textwrap.dedent(f"""\
    modelId: {MODEL}
    modelVersion: 1
    backend: vllm
    engine:
      max_model_len: 512
      dtype: float32
      enforce_eager: true
    """)
PLUGIN_MANIFEST = textwrap.dedent("""\
    plugins:
      - name: marker
        source: plugins/marker
        entryPoint: llmserve_test_marker:register
        group: vllm.general_plugins
    """)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path, api_key: str | None, grpc_port: int | None = None):
        self.proc, self.port, self.log, self.api_key = proc, port, log, api_key
        self.base_url = f"http://127.0.0.1:{port}"
        self.grpc_port = grpc_port
        self.grpc_url = f"127.0.0.1:{grpc_port}"

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(
    package: Path,
    log: Path,
    *,
    api_key: str | None,
    env_extra: dict | None = None,
    args: tuple[str, ...] = (),
    ready_timeout: float = 240,
    openai: bool = True,
) -> RunningServer:
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, **(env_extra or {})}
    env.pop("LLMSERVE_API_KEY", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each server wipes and uses its own metrics folder, as by default
    if api_key:
        env["LLMSERVE_API_KEY"] = api_key  # through the environment, so it never shows in `ps`
    cmd = [
        sys.executable,
        "-m",
        "llmserve.cli.app",
        "serve",
        str(package),
        *(["--openai"] if openai else []),
        "--port",
        str(port),
        "--grpc-port",
        str(grpc_port),
        *args,
    ]
    fh = log.open("wb")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    server = RunningServer(proc, port, log, api_key, grpc_port)
    seen_503 = False
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before ready:\n{server.log_text()[-4000:]}")
        try:
            r = httpx.get(server.base_url + "/health", timeout=2)
            if r.status_code == 503:
                seen_503 = True
            elif r.status_code == 200:
                server.saw_not_ready = seen_503
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_server(server)
    raise RuntimeError(f"server not ready after {ready_timeout} s:\n{server.log_text()[-4000:]}")


def stop_server(server: RunningServer, timeout: float = 60) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


@pytest.fixture(scope="session")
def plugin_marker_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plugin-marker")


@pytest.fixture(scope="session")
def serve_package(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny chat model packaged as a .llmpkg with one general plugin."""
    from llmserve.packaging import build_package

    src = tmp_path_factory.mktemp("serve-src") / "tiny-chat"
    shutil.copytree(tiny_model_dir, src / "model")
    (src / "llmserve.yaml").write_text(MANIFEST + PLUGIN_MANIFEST)
    (src / "plugins" / "marker").mkdir(parents=True)
    (src / "plugins" / "marker" / "llmserve_test_marker.py").write_text(PLUGIN_MODULE)
    return build_package(src, tmp_path_factory.mktemp("serve-dist")).path


@pytest.fixture(scope="session")
def server(tmp_path_factory, serve_package, plugin_marker_dir):
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    srv = start_server(
        serve_package, log, api_key=API_KEY, env_extra={"LLMSERVE_TEST_PLUGIN_MARKER": str(plugin_marker_dir)}
    )
    yield srv
    code = stop_server(srv)
    assert code == 0, srv.log_text()[-3000:]


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, timeout=120, max_retries=0)


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def model_name() -> str:
    return MODEL


@pytest.fixture(scope="session")
def server_control():
    """start_server / stop_server for the one test that needs its own short-lived server."""
    import types

    return types.SimpleNamespace(start=start_server, stop=stop_server)
