"""Daemon processes: launch detached from the CLI (they outlive it), identify them by pid + start
time (a reused pid is not mistaken for ours), probe health, stop with SIGTERM (the server drains)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None if gone/zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    if rest[0] in ("Z", "X"):
        return None
    return rest[19]


def alive(pid: int | None, start: str | None) -> bool:
    if not pid:
        return False
    now = start_time(pid)
    return now is not None and (start is None or now == start)


def launch(argv: list[str], log: Path, pid_file: Path, env: dict[str, str] | None = None) -> tuple[int, str | None]:
    """Start argv in its own session, detached (reparented to init): it outlives this process.

    The launcher shell writes the pid file before returning, so the pid is on disk even if the caller
    dies right after; stdout/stderr go to log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file.unlink(missing_ok=True)
    script = (
        f"exec {shlex.join(argv)} </dev/null >>{shlex.quote(str(log))} 2>&1 & echo $! > {shlex.quote(str(pid_file))}"
    )
    subprocess.run(["/bin/sh", "-c", script], env=env, check=True, start_new_session=True)
    pid = int(pid_file.read_text().strip())
    return pid, start_time(pid)


def read_pid_file(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def terminate(pid: int | None, start: str | None, timeout: float = 60.0) -> bool:
    """SIGTERM, wait up to timeout, then SIGKILL. True if it exited on SIGTERM (or was already gone)."""
    if pid is None or not alive(pid, start):
        return True
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid, start):
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for _ in range(50):
        if not alive(pid, start):
            break
        time.sleep(0.1)
    return False


def health(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of GET url/health, or None if nothing answers."""
    try:
        return httpx.get(url + "/health", timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def log_tail(path: str | Path | None, lines: int = 15) -> str:
    if not path:
        return ""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def serve_argv(package: str, port: int, drain_timeout: float, extra: list[str] | None = None) -> list[str]:
    """The real server: `llmserve serve PKG --openai --host 127.0.0.1 --port N`."""
    return [
        sys.executable,
        "-m",
        "llmserve.cli.app",
        "serve",
        package,
        "--openai",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--grpc-port",
        "0",
        "--drain-timeout",
        f"{drain_timeout:g}",
        *(extra or []),
    ]
