"""Helpers of the model store's tests: a moto S3 server process, packages of any size (no engine, no torch)."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_package(root: Path, model_id: str, version: int, weights_bytes: int, *, seed: int = 0) -> Path:
    """Build a real .llmpkg around `weights_bytes` of seeded random "weights" (a safetensors-shaped
    file: the packager checks names and pickle headers, not tensors)."""
    from llmserve.packaging import build_package

    src = root / "src"
    weights = src / "model"
    weights.mkdir(parents=True, exist_ok=True)
    (weights / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    header = b'{"__metadata__":{}}'
    rng = random.Random(seed)
    with open(weights / "model.safetensors", "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        left = weights_bytes
        while left > 0:
            n = min(left, 4 << 20)
            fh.write(rng.randbytes(n))
            left -= n
    (src / "llmserve.yaml").write_text(f"modelId: {model_id}\nmodelVersion: {version}\nbackend: vllm\n")
    return build_package(src, root / "dist").path


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto server did not start")


def start_moto(log: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    _wait_port(port, proc)
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def aws_test_env(endpoint: str, home: Path, secret: str = "testing-secret-key") -> dict[str, str]:
    """What a CLI run against the test S3 server needs: its endpoint, dummy keys, and AWS config files under
    `home` (none exist there), so nothing comes from the host's AWS configuration."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing-key-id",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(home / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
    }
