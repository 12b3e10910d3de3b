"""A `tritonserver` child process on a model repository: started in explicit model-control mode, ready only when
every model asked for is READY, stopped with its whole process group (Python-backend stubs included).

    with TritonServer(repo, ["my-model"], install=locate_tritonserver(env)) as triton:
        client = tritonclient.grpc.InferenceServerClient(triton.grpc_url)

The server binds 127.0.0.1 (HTTP, gRPC, metrics) on ports chosen free unless given, logs to a file (stdout and
stderr together, so a stub's own traceback lands there too), and exits on any load error at start-up
(``--exit-on-error``). A model that fails to load raises TritonModelLoadError naming it, with Triton's reason and the
log lines that matter; after `stop()` no process of the server's group remains and its shared-memory regions are gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from llmserve.errors import Detail
from llmserve.serve.triton.errors import TritonModelLoadError, TritonStartError
from llmserve.serve.triton.locate import TritonInstall, locate_tritonserver
from llmserve.serve.triton.logs import important_lines, is_address_in_use, load_failure

log = logging.getLogger("llmserve.serve.triton")

DEFAULT_READY_TIMEOUT_S = 180.0
DEFAULT_STOP_TIMEOUT_S = 30.0
# Once Triton reports that no inference is in flight any more and it is unloading its models, they get this long:
# then the group is killed. Unloading is cleanup only (a Python model's finalize, an engine's shutdown), and it took
# 3.6 s for the tiny transformers model and 8 s for a vLLM one here, which made an idle stop take 5-10 s (more on a
# loaded host, up to Triton's exit timeout for a model whose finalize hangs).
UNLOAD_GRACE_S = 2.0
# Triton's log line (server.cc) once its in-flight inferences are done, or its exit timeout spent waiting for them.
_UNLOADING = b"All models are stopped, unloading models"
_POLL_S = 0.1
_PORT_ATTEMPTS = 3
_SHM_DIR = Path("/dev/shm")
_STUB_PROGRAM = b"triton_python_backend_stub"
# vLLM's title for its engine-core process (setproctitle: "VLLM::EngineCore", "VLLM::EngineCore_DP<n>"), which a
# vLLM model instance's AsyncLLM starts as a child of its Python-backend stub.
_ENGINE_CORE_TITLE = b"::EngineCore"


@dataclass(frozen=True)
class TritonPorts:
    http: int
    grpc: int
    metrics: int


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports free on host now (held open together so that none repeats)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group pgid, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


class TritonServer:
    """One `tritonserver` process hosting models of one repository (a context manager: start, then stop)."""

    def __init__(
        self,
        model_repository: Path | Sequence[Path],
        models: Sequence[str],
        *,
        install: TritonInstall | None = None,
        python_env: Path | None = None,
        workdir: Path | None = None,
        log_path: Path | None = None,
        host: str = "127.0.0.1",
        ports: TritonPorts | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT_S,
        exit_on_error: bool = True,
        extra_args: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
    ):
        # several repositories: one Triton hosts models of several packages (each package is one repository)
        given = [model_repository] if isinstance(model_repository, (str, os.PathLike)) else list(model_repository)
        self.model_repositories = [Path(r).resolve() for r in given]
        self.model_repository = self.model_repositories[0]
        self.models = list(models)
        self.install = install or locate_tritonserver(python_env)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="llmserve-triton-"))
        self.log_path = Path(log_path) if log_path else self.workdir / "tritonserver.log"
        self.host = host
        self._fixed_ports = ports
        self.ports: TritonPorts | None = None
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.exit_on_error = exit_on_error
        self.extra_args = list(extra_args)
        self._environ = dict(os.environ if environ is None else environ)
        # Python-backend shared-memory regions are /dev/shm/<prefix><uuid>: ours are found (and removed) by it.
        self.shm_prefix = f"llmserve_triton_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._log_offset = 0  # where this start's lines begin in log_path (appended to, never truncated)
        self._was_ready = False
        self.pgid: int | None = None  # the server's process group (its pid), kept after stop for checks

    # -- addresses -------------------------------------------------------------------------------------------

    def _require_ports(self) -> TritonPorts:
        if self.ports is None:
            raise TritonStartError("the Triton server is not started", hint="Call start() (or use `with`) first.")
        return self.ports

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self._require_ports().http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self._require_ports().grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self._require_ports().metrics}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def exit_code(self) -> int | None:
        """The server's exit status once it has exited on its own; None while it runs (or before start)."""
        return self._proc.poll() if self._proc is not None else None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    # -- lifetime --------------------------------------------------------------------------------------------

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def command(self, backend_dir: Path, ports: TritonPorts) -> list[str]:
        args = [
            str(self.install.binary),
            *[f"--model-repository={repo}" for repo in self.model_repositories],
            f"--backend-directory={backend_dir}",
            "--model-control-mode=explicit",
            *[f"--load-model={name}" for name in self.models],
            f"--exit-on-error={'true' if self.exit_on_error else 'false'}",
            "--strict-readiness=true",
            f"--exit-timeout-secs={max(1, int(self.stop_timeout))}",
            f"--http-address={self.host}",
            f"--http-port={ports.http}",
            f"--grpc-address={self.host}",
            f"--grpc-port={ports.grpc}",
            f"--metrics-address={self.host}",
            f"--metrics-port={ports.metrics}",
            "--allow-gpu-metrics=false",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        if self.install.layout == "wheel":
            args.append("--pinned-memory-pool-byte-size=0")  # the wheel runs on CPU hosts: no CUDA to pin with
        return args + self.extra_args

    def start(self) -> TritonServer:
        """Start the server and wait until every model is READY; on failure nothing is left running."""
        if self._proc is not None:
            return self
        backend_dir = self.install.write_backend_dir(self.workdir / "backends")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            for attempt in range(_PORT_ATTEMPTS):
                self.ports = self._fixed_ports or TritonPorts(*free_ports(self.host, 3))
                self._spawn(backend_dir)
                try:
                    self._wait_ready()
                    return self
                except TritonStartError:
                    retry = self._fixed_ports is None and attempt + 1 < _PORT_ATTEMPTS
                    if not (retry and is_address_in_use(self.log_text())):
                        raise
                    log.info("a port Triton was given was taken meanwhile; starting it again on others")
                    self._terminate()
        except BaseException:
            self._terminate()
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self, backend_dir: Path) -> None:
        assert self.ports is not None
        argv = self.command(backend_dir, self.ports)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in _terminate
        log.info("starting Triton: %s", " ".join(argv))
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=self.install.environment(self._environ),
            cwd=self.workdir,
            # its own process group (stop() ends the stubs with it), in the caller's session: a supervisor that
            # stops the whole session of a killed llmserve (llmserve.deploy.procs.kill_session) stops Triton too
            process_group=0,
        )
        self.pgid = self._proc.pid

    def _client(self, timeout: float) -> Any:
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(
            self.http_url, connection_timeout=min(timeout, 5.0), network_timeout=timeout
        )

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout
        client = None
        try:
            while True:
                if self._proc.poll() is not None:
                    raise self._exited_error(self._proc.returncode)
                if client is None:
                    client = self._client(5.0)
                if self._all_ready(client):
                    self._was_ready = True
                    log.info("Triton ready on %s with %s", self.http_url, ", ".join(self.models))
                    return
                if time.monotonic() > deadline:
                    raise self._start_error(
                        f"Triton did not become ready in {self.ready_timeout:.0f} s "
                        f"(models: {', '.join(self.models) or 'none'})"
                    )
                time.sleep(_POLL_S)
        finally:
            if client is not None:
                client.close()

    def _all_ready(self, client: Any) -> bool:
        from tritonclient.utils import InferenceServerException

        try:
            if not client.is_server_live():
                return False
            not_ready = [m for m in self.models if not client.is_model_ready(m)]
        except (InferenceServerException, OSError, ConnectionError):
            return False  # not listening yet: explicit --load-model loads before the endpoints open
        if not_ready and not self.exit_on_error:
            self._raise_if_unavailable(client, not_ready)
        return not not_ready and self._metrics_listening()

    def _metrics_listening(self) -> bool:
        """Triton opens its metrics endpoint after HTTP and gRPC: without this wait a scrape right after start
        finds nothing there (llmserve's merged /metrics would say the Triton source is down)."""
        assert self.ports is not None
        try:
            with socket.create_connection((self.host, self.ports.metrics), timeout=1.0):
                return True
        except OSError:
            return False

    def _raise_if_unavailable(self, client: Any, models: list[str]) -> None:
        """Without --exit-on-error a failed model stays UNAVAILABLE in a live server: that is an answer too."""
        for entry in client.get_model_repository_index():
            if entry.get("name") in models and entry.get("state") == "UNAVAILABLE":
                raise self.load_error(entry["name"], entry.get("reason"))

    def _new_log(self) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode("utf-8", errors="replace")
        return ""

    def _exited_error(self, code: int) -> TritonStartError | TritonModelLoadError:
        text = self._new_log()
        for model in self.models:
            if load_failure(text, model) is not None:
                return self.load_error(model)
        return self._start_error(f"tritonserver exited with code {code} before it was ready")

    def _start_error(self, message: str) -> TritonStartError:
        lines = important_lines(self._new_log()) or self._new_log().splitlines()[-15:]
        return TritonStartError(
            message,
            hint=f"Read Triton's log: {self.log_path}",
            details=[Detail("Triton's log, the lines that matter", ["line"], [[line] for line in lines])],
        )

    def load_error(self, model: str, reason: str | None = None) -> TritonModelLoadError:
        """The error for `model` not loading: Triton's reason and the log lines about it."""
        text = self._new_log()
        why = load_failure(text, model) or reason or "see Triton's log"
        lines = important_lines(text, model)
        return TritonModelLoadError(
            f"Triton could not load model '{model}': {why}",
            hint=f"Fix the model (Triton's log: {self.log_path}), rebuild it with `llmserve package`, and serve again.",
            details=[Detail(f"Triton's log about '{model}'", ["line"], [[line] for line in lines])],
        )

    # -- explicit model control ------------------------------------------------------------------------------

    def load_model(self, name: str) -> None:
        """Load (or reload) `name` from the repository; TritonModelLoadError if it does not become READY."""
        from tritonclient.utils import InferenceServerException

        client = self._client(self.ready_timeout)
        try:
            client.load_model(name)
            if not client.is_model_ready(name):
                raise self.load_error(name)
        except InferenceServerException as exc:
            raise self.load_error(name, str(exc.message())) from exc
        finally:
            client.close()
        if name not in self.models:
            self.models.append(name)

    def unload_model(self, name: str) -> None:
        client = self._client(self.stop_timeout)
        try:
            client.unload_model(name)
        finally:
            client.close()
        if name in self.models:
            self.models.remove(name)

    def is_model_ready(self, name: str) -> bool:
        from tritonclient.utils import InferenceServerException

        client = self._client(5.0)
        try:
            return bool(client.is_model_ready(name))
        except (InferenceServerException, OSError, ConnectionError):
            return False
        finally:
            client.close()

    # -- stopping --------------------------------------------------------------------------------------------

    def processes(self) -> list[int]:
        """Live processes of the server's group (the server and its Python-backend stubs); [] once stopped."""
        return group_members(self.pgid) if self.pgid is not None else []

    def python_stubs(self) -> dict[int, str]:
        """Live Python-backend stubs of the server (one per model instance): pid -> the model it runs."""
        stubs = {}
        for pid in self.processes():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            # argv[1] is <repository>/<model>/<version>/model.py, also for a backend's shared model.py
            if len(argv) > 1 and argv[0].endswith(_STUB_PROGRAM):
                stubs[pid] = Path(argv[1].decode(errors="replace")).parent.parent.name
        return stubs

    def engine_cores(self) -> dict[int, str]:
        """Live vLLM engine cores of the server's models: pid -> the model. A vLLM model instance runs its engine in
        a child process of its Python-backend stub; killed, it leaves the stub (and the model, READY) behind."""
        stubs = self.python_stubs()
        cores = {}
        for pid in self.processes():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()  # state ppid ...
            if len(fields) >= 2 and int(fields[1]) in stubs and _ENGINE_CORE_TITLE in cmdline:
                cores[pid] = stubs[int(fields[1])]
        return cores

    def stop(self, grace: float | None = None, unload_s: float | None = None) -> None:
        """SIGTERM the server (Triton drains in-flight requests, then unloads models), SIGKILL its group after
        `grace` (default stop_timeout); then no process of the group remains and the server's shared memory is
        removed. A working folder llmserve made is removed too, unless the server failed or crashed (its log
        stays for reading).

        `unload_s` (e.g. UNLOAD_GRACE_S): also kill the group that long after Triton logs that it is unloading
        its models. Only for a caller that has already drained every request itself (llmserve's frontends in
        front of an embedded Triton): Triton logs that line while a Python-backend model is still inside
        execute() for a request, so with clients on Triton's own ports (standalone) it would cut them short."""
        crashed = self.exit_code() not in (None, 0)  # exited on its own: its log says why, and stays
        self._terminate(self.stop_timeout if grace is None else grace, unload_s)
        if self._own_workdir and self._was_ready and not crashed:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _terminate(self, grace: float | None = None, unload_s: float | None = None) -> None:
        grace = self.stop_timeout if grace is None else grace
        proc, self._proc = self._proc, None
        if proc is not None:
            pgid = proc.pid  # process_group=0: the server leads its own group
            _signal_group(pgid, signal.SIGTERM)
            if not self._wait_stopped(proc, grace + 5.0, unload_s):
                _signal_group(pgid, signal.SIGKILL)
                proc.wait()
            if not _wait_group_gone(pgid, 5.0):
                _signal_group(pgid, signal.SIGKILL)
                _wait_group_gone(pgid, 5.0)
        for region in self._shm_regions():
            with contextlib.suppress(OSError):
                region.unlink()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _wait_stopped(self, proc: subprocess.Popen[bytes], timeout: float, unload_s: float | None) -> bool:
        """Wait for the SIGTERMed server to exit: True if it did; False when it is to be killed (timeout spent, or
        its models still unloading unload_s after Triton began unloading them)."""
        deadline = time.monotonic() + timeout
        unloading_since: float | None = None
        with contextlib.ExitStack() as stack:
            tail = None
            if unload_s is not None:
                with contextlib.suppress(OSError):
                    tail = stack.enter_context(open(self.log_path, "rb"))
                    tail.seek(self._log_offset)
            seen = b""
            while True:
                try:
                    proc.wait(_POLL_S)
                    return True
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if tail is not None and unloading_since is None:
                    seen = seen[-len(_UNLOADING) :] + tail.read()
                    if _UNLOADING in seen:
                        unloading_since = now
                if unload_s is not None and unloading_since is not None and now - unloading_since > unload_s:
                    log.info(
                        "Triton's models still unloading %.1f s after its last request ended; stopping them", unload_s
                    )
                    return False
                if now > deadline:
                    log.warning("Triton did not stop in %.0f s after SIGTERM; killing it", timeout)
                    return False

    def _shm_regions(self) -> Iterator[Path]:
        if _SHM_DIR.is_dir():
            yield from _SHM_DIR.glob(f"{self.shm_prefix}*")


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True
