"""The gateway's watchdog: the daemon `llmserve deploy` starts for a deployment's entry point.

It binds the gateway's port (and its gRPC port, when the deployment has one) once and runs the gateway as
its child on those sockets, starting it again (0.2 s, then doubling up to 10 s) whenever it exits. Because
the watchdog keeps the listening sockets open, connections that arrive while the gateway restarts wait in
the kernel's backlog instead of being refused; the new gateway reads its routes from the state database
and serves them. SIGTERM
(`deploy down`) is passed to the gateway, which drains, and then the watchdog exits. The gateway
gets SIGTERM from the kernel if the watchdog itself is killed (PR_SET_PDEATHSIG), so no gateway
outlives its watchdog.

    python -m llmserve.deploy.watchdog --state-dir D --deployment NAME --host H --port P [--grpc-port G]

--host takes an IPv4 or an IPv6 address (`::1`, or `::`: every address, IPv4 clients too where the system
allows it); the socket's family follows it.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import socket
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.2, 10.0
STABLE_S = 30.0  # a gateway up this long resets the backoff


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def listen(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, IPv4 or IPv6 by the host (`[::1]` or `::1`; `::` with IPv4 clients too
    where the system allows it). Kept free of llmserve imports: this daemon starts in a blink."""
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in host:
        dual = host == "::" and socket.has_dualstack_ipv6()
        return socket.create_server(
            (host, port), family=socket.AF_INET6, backlog=1024, reuse_port=False, dualstack_ipv6=dual
        )
    return socket.create_server((host, port), backlog=1024, reuse_port=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmserve-watchdog", description="Keeps one deployment's gateway running.")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int)
    args = parser.parse_args(argv)

    held: list[socket.socket] = []
    for port in (args.port, args.grpc_port):
        if port is None:
            continue
        try:
            held.append(listen(args.host, port))
        except OSError as exc:
            print(f"watchdog: cannot listen on {args.host}:{port}: {exc}", file=sys.stderr, flush=True)
            return 1
    child: subprocess.Popen | None = None
    stopping = False

    def on_term(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    gateway = [
        sys.executable,
        "-m",
        "llmserve.deploy.gateway",
        "--state-dir",
        args.state_dir,
        "--deployment",
        args.deployment,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--fd",
        str(held[0].fileno()),
        *(["--grpc-fd", str(held[1].fileno())] if len(held) > 1 else []),
    ]
    backoff = MIN_BACKOFF_S / 2  # doubled before the first wait
    while not stopping:
        started = time.monotonic()
        child = subprocess.Popen(gateway, pass_fds=[s.fileno() for s in held], preexec_fn=_die_with_parent)
        code = child.wait()
        if stopping:
            break
        backoff = MIN_BACKOFF_S if time.monotonic() - started > STABLE_S else min(backoff * 2, MAX_BACKOFF_S)
        print(
            f"watchdog: the gateway exited with {code}; starting it again in {backoff:g} s", file=sys.stderr, flush=True
        )
        deadline = time.monotonic() + backoff
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.05)
    if child is not None:
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()
    for s in held:
        s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
