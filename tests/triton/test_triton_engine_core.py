"""A vLLM-backend model in Triton whose engine core dies: Triton keeps the model READY (its stub lives on) and every
request fails, so `llmserve serve --engine triton` must not look alive: it exits 7 (the engine died) within a
supervision tick, as for a dead stub or a dead Triton, and leaves no process behind. /health, the liveness probe's
route, stops saying 200 within that tick."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
from support.models import write_vllm_source
from support.processes import processes_mentioning
from triton_serving import start_serve, stop, wait_ready

from llmserve.errors import ExitCode
from llmserve.packaging import build_package
from llmserve.serve.triton.server import group_members

# A supervision tick is a second; the rest is slack for a loaded 2-core host.
DEAD_WITHIN_S = 10.0


def _tritonserver_of(serve_pid: int) -> int:
    marker = f"llmserve_triton_{serve_pid}_".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline and cmdline.split(b"\0")[0].endswith(b"tritonserver"):
                return int(entry.name)
    raise AssertionError("no tritonserver of this llmserve")


def _engine_cores(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            names = (entry / "comm").read_bytes() + (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[2]) == pgid and stat[0] != "Z" and b"EngineCore" in names:
            found.append(int(entry.name))
    return found


def _health(port: int) -> int | None:
    """/health's status code; None when nothing answers (the server is gone)."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code
    except httpx.HTTPError:
        return None


def test_a_killed_engine_core_inside_triton_ends_llmserve_with_the_engine_exit_code(
    tmp_path, tiny_model_dir, triton_env
):
    package = build_package(write_vllm_source(tmp_path / "llm", tiny_model_dir), tmp_path / "dist").path
    served = start_serve([package], tmp_path / "serve.log", triton_env)
    try:
        wait_ready(served)
        assert _health(served.http) == 200
        pgid = _tritonserver_of(served.proc.pid)  # Triton leads its own process group: its stubs and engine cores
        (core,) = _engine_cores(pgid)
        killed_at = time.monotonic()
        os.kill(core, signal.SIGKILL)
        last_200 = None
        while served.proc.poll() is None and time.monotonic() - killed_at < 60:
            if _health(served.http) == 200:
                last_200 = time.monotonic() - killed_at
            time.sleep(0.2)
        code = served.proc.wait(60)
        exited_after = time.monotonic() - killed_at
        assert code == ExitCode.ENGINE, served.text()[-3000:]
        assert exited_after < DEAD_WITHIN_S + 10, exited_after  # a supervision tick and a short stop, not a drain
        assert last_200 is None or last_200 < DEAD_WITHIN_S, last_200
        assert f"the vLLM engine core of model 'tiny-chat' (pid {core}) died" in served.text(), served.text()[-3000:]
    finally:
        stop(served)
    assert not processes_mentioning(f"llmserve_triton_{served.proc.pid}_")
    assert not group_members(pgid)  # engine cores too (their process title no longer names the server)


class _FakeTriton:
    """What supervision reads of a TritonServer: a vLLM model whose stub lives on and whose engine core is gone."""

    log_path = "tritonserver.log"

    def __init__(self) -> None:
        self.models = ["tiny-chat"]
        self.cores = {11: "tiny-chat"}

    def exit_code(self) -> None:
        return None

    def python_stubs(self) -> dict[int, str]:
        return {10: "tiny-chat"}

    def engine_cores(self) -> dict[int, str]:
        return self.cores

    def is_model_ready(self, model: str) -> bool:
        return True


def test_supervision_names_the_engine_core_that_died_while_its_model_stays_ready(monkeypatch):
    from llmserve.serve.triton import host

    monkeypatch.setattr(host, "SUPERVISE_INTERVAL_S", 0.01)
    triton = _FakeTriton()

    async def supervise() -> str | None:
        watch = asyncio.ensure_future(host._supervise(triton, asyncio.Event()))
        await asyncio.sleep(0.1)
        assert not watch.done()  # stub, engine core and model alive: serving
        triton.cores = {}
        return await asyncio.wait_for(watch, 5)

    died = asyncio.run(supervise())
    assert died is not None and died.startswith("the vLLM engine core of model 'tiny-chat' (pid 11) died")
