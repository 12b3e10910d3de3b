"""Daemon processes: launch detached from the CLI (they outlive it), identify them by pid + start
time (a reused pid is not mistaken for ours), probe health, stop with SIGTERM (the server drains).

Each daemon gets a session of its own (the launcher shell's pid is its session id), and whatever it
spawns stays in that session: vLLM's engine core, multiprocessing's resource tracker. A server killed
with SIGKILL leaves those behind, reparented to init; the session id finds them, so stopping a daemon
stops its whole tree and memory figures count the whole tree."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def bare_host(host: str) -> str:
    """A host as sockets take it: an IPv6 literal without the brackets a URL puts around it."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def family(host: str) -> socket.AddressFamily:
    """The socket family of an address literal (or name): IPv6 for one with a colon (`::1`, `::`), else IPv4."""
    return socket.AF_INET6 if ":" in bare_host(host) else socket.AF_INET


def http_url(host: str, port: int) -> str:
    """http://HOST:PORT with an IPv6 literal in brackets (`http://[::1]:8000`): without them the URL is invalid."""
    host = bare_host(host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(family(host)) as s:
        s.bind((bare_host(host), 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    with socket.socket(family(host)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bare_host(host), port))
            return True
        except OSError:
            return False


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone or a zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    if rest[0] in ("Z", "X"):
        return None
    return rest


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None if gone/zombie."""
    rest = _stat(pid)
    return rest[19] if rest else None


def session_of(pid: int) -> int | None:
    rest = _stat(pid)
    return int(rest[3]) if rest else None


def session_members(session: int | None) -> list[int]:
    """Live processes of a daemon's session, leader or orphans.

    A session id stays reserved while any process is in the session, and our launcher shell (the
    session's first leader) is gone once launch() returns. So a live process whose pid *is* the
    session id means the number was reused by someone else after all of ours exited: nothing to find."""
    if not session or session <= 1 or session == os.getsid(0):
        return []
    if _stat(session) is not None:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            rest = _stat(int(entry.name))
            if rest is not None and int(rest[3]) == session:
                found.append(int(entry.name))
    return found


def kill_session(session: int | None, grace: float = 5.0) -> int:
    """SIGTERM every process left in a daemon's session, SIGKILL what outlives grace. Returns how many."""
    members = session_members(session)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in members:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline and any(_stat(p) is not None for p in members):
            time.sleep(0.05)
        if not any(_stat(p) is not None for p in members):
            break
    return len(members)


def rss_bytes(session: int | None, pid: int | None = None) -> int:
    """Resident memory of a daemon's whole session (the server, its engine core, helpers)."""
    pids = session_members(session) if session else []
    if not pids and pid:
        pids = [pid]
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def alive(pid: int | None, start: str | None) -> bool:
    if not pid:
        return False
    now = start_time(pid)
    return now is not None and (start is None or now == start)


@dataclass(frozen=True)
class Launched:
    pid: int
    start: str | None
    session: int  # the launcher shell's pid: every process the daemon spawns carries it


def launch(argv: list[str], log: Path, pid_file: Path, env: dict[str, str] | None = None, **kw) -> Launched:
    """Start argv in its own session, detached (reparented to init): it outlives this process.

    The launcher shell writes the pid file before returning, so the pid is on disk even if the caller
    dies right after; stdout/stderr go to log. Extra keywords go to subprocess (pass_fds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file.unlink(missing_ok=True)
    script = (
        f"exec {shlex.join(argv)} </dev/null >>{shlex.quote(str(log))} 2>&1 & echo $! > {shlex.quote(str(pid_file))}"
    )
    launcher = subprocess.Popen(["/bin/sh", "-c", script], env=env, start_new_session=True, **kw)
    if launcher.wait() != 0:
        raise subprocess.CalledProcessError(launcher.returncode, argv)
    pid = int(pid_file.read_text().strip())
    return Launched(pid, start_time(pid), launcher.pid)


def read_pid_file(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def terminate(pid: int | None, start: str | None, timeout: float = 60.0, session: int | None = None) -> bool:
    """SIGTERM, wait up to timeout, then SIGKILL; then stop whatever is left of its session (children
    a killed server could not stop). True if it exited on SIGTERM (or was already gone)."""
    clean = _terminate_one(pid, start, timeout)
    kill_session(session)
    return clean


def _terminate_one(pid: int | None, start: str | None, timeout: float) -> bool:
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


def serve_argv(
    package: str,
    port: int,
    drain_timeout: float,
    extra: list[str] | None = None,
    grpc_port: int = 0,
    openai: bool = True,
) -> list[str]:
    """The real server: `llmserve serve PKG --openai --host 127.0.0.1 --port N --grpc-port M` (KServe v2 gRPC
    on loopback too, for the gateway's gRPC entry point; 0: any free port, unknown to the gateway). `openai`
    False: no --openai, for a package that generates no text (a Python-backend model with `python.frontend:
    none`, hosted in Triton): serve refuses --openai for it, and it answers KServe v2 only."""
    return [
        sys.executable,
        "-m",
        "llmserve.cli.app",
        "serve",
        package,
        *(["--openai"] if openai else []),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--grpc-port",
        str(grpc_port),
        "--drain-timeout",
        f"{drain_timeout:g}",
        *(extra or []),
    ]
