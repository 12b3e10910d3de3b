"""`llmserve serve --engine triton` as a subprocess for the tests: start it on packages, wait for ready, stop it."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.cli import cli_argv, cli_env

from llmserve.serve.triton import PYTHON_ENV_ENV
from llmserve.serve.triton.server import free_ports

READY_TIMEOUT_S = 600


class Served:
    def __init__(self, proc: subprocess.Popen, log: Path, http: int, grpc: int, metrics: int):
        self.proc, self.log, self.http, self.grpc, self.metrics = proc, log, http, grpc, metrics
        self.packages: list[Path] = []

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def start_serve(packages: list[Path], log: Path, triton_env: Path, *extra: str, api_key: str = "") -> Served:
    http, grpc, metrics = free_ports("127.0.0.1", 3)
    args = [*packages, "--engine", "triton", "--port", http, "--grpc-port", grpc, "--metrics-port", metrics, *extra]
    proc = subprocess.Popen(
        cli_argv("serve", *args),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=cli_env({PYTHON_ENV_ENV: str(triton_env), "LLMSERVE_API_KEY": api_key}),
    )
    return Served(proc, log, http, grpc, metrics)


def wait_ready(served: Served) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while "ready in" not in served.text():
        if served.proc.poll() is not None:
            pytest.fail(f"llmserve serve exited with {served.proc.returncode}:\n{served.text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"not ready in {READY_TIMEOUT_S} s:\n{served.text()[-4000:]}")
        time.sleep(0.5)


def stop(served: Served) -> int:
    if served.proc.poll() is None:
        served.proc.send_signal(signal.SIGTERM)
    return served.proc.wait(120)
