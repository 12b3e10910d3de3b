"""One real vLLM engine (tiny model, in-process, with llmserve's constraint processor as `llmserve
serve` loads it by default) behind the KServe v2 gRPC and HTTP frontends.

The frontends and the engine run on one asyncio loop in a background thread, the way
`llmserve serve` runs them; tests talk to them with real clients (tritonclient gRPC/HTTP, httpx)
from the test thread. The frontends are started before the engine, and what clients see then
(not ready, UNAVAILABLE) is recorded once for the readiness tests. The frontends record into a real
ServerMetrics, read back through its multiprocess exposition as `llmserve serve` serves it on /metrics.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from llmserve.serve.environment import CPU_DEFAULTS, KV_SPACE, KV_SPACE_DEFAULTED, RUNNER_DEFAULTS

# Engine settings measured on CPU machines (llmserve/serve/environment.py), set before anything imports vLLM.
# They stay in this pytest process's environment for the whole session, so every server a later test starts
# inherits them: the KV cache size is marked as llmserve's default (as `llmserve serve` marks it), or a package
# with its own kv_cache_memory_bytes would be refused as if an operator had chosen both.
if KV_SPACE not in os.environ:
    os.environ[KV_SPACE_DEFAULTED] = "1"
for _k, _v in {**CPU_DEFAULTS, **RUNNER_DEFAULTS}.items():
    os.environ.setdefault(_k, _v)

# prometheus_client picks multiprocess mode when it is first imported (by vLLM or ServerMetrics), so the
# folder is set at collection, before any test runs; a fresh one, so no stale .db file is summed in.
if "PROMETHEUS_MULTIPROC_DIR" not in os.environ and "prometheus_client" not in sys.modules:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir = tempfile.mkdtemp(prefix="llmserve-kserve-metrics-")
    atexit.register(shutil.rmtree, _metrics_dir, ignore_errors=True)

MODEL = "tiny-chat"  # tests/conftest.py's tiny_vllm_package: modelId tiny-chat, modelVersion 1
API_KEY = "kserve-test-key-0123"


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kserve-test-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 300) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class KServeServer:
    loop: LoopThread
    readiness: Any
    grpc_url: str  # host:port, as tritonclient.grpc wants it
    http_url: str  # host:port, as tritonclient.http wants it
    grpc_auth_url: str  # a second gRPC frontend on the same engine, with an API key
    metrics: Any = None  # the ServerMetrics all three frontends record into
    model: str = MODEL
    version: str = "1"
    api_key: str = API_KEY
    before_ready: dict = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://{self.http_url}"


def _hostport(address: str) -> str:
    return address.split("://", 1)[1]


def _observe_not_ready(grpc_url: str, http_url: str) -> dict:
    """What real clients see while the engine is still starting."""
    import httpx
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    seen: dict = {}
    with grpcclient.InferenceServerClient(grpc_url) as c:
        seen["grpc_live"] = c.is_server_live()
        seen["grpc_ready"] = c.is_server_ready()
        seen["grpc_model_ready"] = c.is_model_ready(MODEL)
        inp = grpcclient.InferInput("text_input", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"hello"], dtype=object))
        try:
            c.infer(MODEL, [inp])
            seen["grpc_infer"] = "ok"
        except InferenceServerException as exc:
            seen["grpc_infer"] = (exc.status(), exc.message())
        got: list = []
        done = threading.Event()
        c.start_stream(callback=lambda result, error: (got.append((result, error)), done.set()))
        try:
            c.async_stream_infer(MODEL, [inp])
            done.wait(30)
        finally:
            c.stop_stream()
        seen["grpc_stream"] = got
    seen["http_live"] = httpx.get(f"http://{http_url}/v2/health/live").status_code
    seen["http_ready"] = httpx.get(f"http://{http_url}/v2/health/ready").status_code
    r = httpx.post(f"http://{http_url}/v2/models/{MODEL}/generate", json={"text_input": "hi"})
    seen["http_generate"] = (r.status_code, r.json())
    return seen


@pytest.fixture(scope="session")
def kserve_server(tiny_vllm_package):
    from llmserve.packaging.opened import open_package
    from llmserve.serve.environment import CACHE_VARS
    from llmserve.serve.kserve import KServeGrpcFrontend, KServeHttpFrontend
    from llmserve.serve.readiness import Readiness

    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        pytest.fail(
            "prometheus_client was imported before tests/serve_kserve/conftest.py could set "
            "PROMETHEUS_MULTIPROC_DIR; set it in the environment to run these tests"
        )
    from llmserve.serve.metrics import ServerMetrics

    if KV_SPACE not in os.environ:
        # without it vLLM's CPU worker asks for 92% of the machine's memory free and fails on a busy one
        pytest.fail(
            f"{KV_SPACE} was removed from this pytest process's environment by an earlier test (this "
            "conftest sets it at collection): run engine scripts in a child process, never import them here"
        )
    for var in CACHE_VARS:  # set per session by tests/conftest.py; the engine needs them to exist
        if os.environ.get(var):
            os.makedirs(os.environ[var], exist_ok=True)
    package = open_package(tiny_vllm_package)
    version = package.manifest.modelVersion
    loop = LoopThread()
    readiness = Readiness()
    metrics = ServerMetrics()
    frontends = [
        KServeGrpcFrontend("127.0.0.1", 0, model_version=version, metrics=metrics),
        KServeHttpFrontend("127.0.0.1", 0, model_version=version, metrics=metrics),
        KServeGrpcFrontend("127.0.0.1", 0, model_version=version, api_key=API_KEY, metrics=metrics),
    ]
    handle = None

    async def start_frontends():
        for f in frontends:
            await f.start(readiness)

    async def start():
        from llmserve.serve.engine import merged_engine_args, start_engine
        from llmserve.serve.options import ServeOptions

        # what `llmserve serve` adds by default: the constraint processor (test_kserve_constraints.py)
        args = merged_engine_args(package.manifest.engine, ServeOptions(package=tiny_vllm_package).engine_overrides())
        return await start_engine(package, package.manifest.modelId, args)

    async def stop():
        readiness.set_draining()
        for f in frontends:
            await f.drain(10)

    try:
        loop.run(start_frontends(), 60)
        server = KServeServer(
            loop,
            readiness,
            _hostport(frontends[0].address),
            _hostport(frontends[1].address),
            _hostport(frontends[2].address),
            metrics=metrics,
            version=str(version),
        )
        server.before_ready = _observe_not_ready(server.grpc_url, server.http_url)
        handle = loop.run(start(), 300)
        readiness.set_ready(handle)
        yield server
    finally:
        try:
            loop.run(stop(), 60)
        finally:
            if handle is not None:
                handle.shutdown()
            # drop every reference while modules are alive (AsyncLLM.__del__ would shut down again at exit)
            readiness.handle = handle = None
            readiness.phase = "stopped"
            import gc

            gc.collect()
            loop.stop()


@pytest.fixture(scope="session")
def grpc_client(kserve_server):
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(kserve_server.grpc_url) as c:
        yield c


@pytest.fixture(scope="session")
def http_client(kserve_server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(kserve_server.http_url, network_timeout=300, connection_timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="session")
def http(kserve_server):
    import httpx

    with httpx.Client(base_url=kserve_server.base_url, timeout=300) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
