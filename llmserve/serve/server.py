"""One server process: the startup sequence, the frontends on one engine, and graceful shutdown.

Startup steps, in order, each logged with its duration (and exported as llmserve_startup_step_seconds):
  1. environment   engine/cache environment variables (before vLLM is imported)
  2. package       open the package: verify and unpack a .llmpkg (reusing the local cache); refuse
                   engine arguments that load code unless --trust-remote-code
  3. plugins       register llmserve's engine-process fixes and the package's vLLM plugins as
                   Python entry points
  4. metrics-dir   wipe and set PROMETHEUS_MULTIPROC_DIR (before prometheus_client is imported)
  5. listen        bind the frontends' ports: /health answers 503 "starting", inference is refused
  6. engine        import-check plugins, build AsyncLLM from the manifest's engine args, attach
                   vLLM's serving objects
  7. ready         /health answers 200 and inference is accepted
SIGTERM or SIGINT at any point: /health turns 503 "draining", listeners close, in-flight requests
finish (bounded by --drain-timeout), the engine shuts down, and the process exits 0.
An engine that dies once ready (its engine-core process killed, a fatal error inside it) ends the
process at once with exit code 7 (ExitCode.ENGINE) and the cause logged: a server that cannot answer
must not look alive to its supervisor, which restarts it. So does an engine that hangs: its core is
pinged every ENGINE_PING_INTERVAL_S with a no-op call it answers between two steps, and one that does
not answer within the stall timeout (--engine-stall-timeout, else env
LLMSERVE_ENGINE_STALL_TIMEOUT_S, else 60 s) turns /health to 503 "engine-error" and ends the process with exit
code 7 too. /health is what the Kubernetes liveness probe reads (llmserve.deploy.kubernetes.manifests).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llmserve.errors import ExitCode
from llmserve.serve.metrics import ServerMetrics, record_steps
from llmserve.serve.options import ServeOptions
from llmserve.serve.readiness import Readiness

log = logging.getLogger("llmserve.serve")

# How often the engine's liveness is read once ready (a flag read: cheap), and how long requests
# still in flight get to end after the engine died (they are failing already; a supervisor waits).
ENGINE_WATCH_INTERVAL_S = 0.25
DEAD_ENGINE_DRAIN_S = 2.0
# How often the engine core is pinged (a round trip it answers between two steps).
ENGINE_PING_INTERVAL_S = 5.0


def frontend_factories() -> dict[str, Callable]:
    """Frontends this build contains, by name: factory(options, metrics, package) -> Frontend."""
    # deferred: the frontends import grpc and fastapi (the serve extra), which `llmserve --help` must not need
    from llmserve.serve.kserve import KServeGrpcFrontend, KServeHttpFrontend
    from llmserve.serve.openai.frontend import OpenAIFrontend

    def openai(options: ServeOptions, metrics, package) -> OpenAIFrontend:
        # The KServe v2 HTTP routes share the OpenAI app's port.
        return OpenAIFrontend(
            options.host,
            options.port,
            api_key=options.api_key,
            max_body_bytes=options.max_body_bytes,
            max_prompt_chars=options.max_prompt_chars,
            metrics=metrics,
            kserve_model_version=package.manifest.modelVersion,
        )

    def kserve_http(options: ServeOptions, metrics, package) -> KServeHttpFrontend:
        return KServeHttpFrontend(
            options.host,
            options.port,
            model_version=package.manifest.modelVersion,
            api_key=options.api_key,
            max_body_bytes=options.max_body_bytes,
            max_prompt_chars=options.max_prompt_chars,
            metrics=metrics,
        )

    def kserve_grpc(options: ServeOptions, metrics, package) -> KServeGrpcFrontend:
        return KServeGrpcFrontend(
            options.host,
            options.grpc_port,
            model_version=package.manifest.modelVersion,
            api_key=options.api_key,
            max_message_bytes=options.max_body_bytes,
            max_prompt_chars=options.max_prompt_chars,
            metrics=metrics,
        )

    return {"openai": openai, "kserve-http": kserve_http, "kserve-grpc": kserve_grpc}


def requested_frontends(options: ServeOptions) -> list[str]:
    """With --openai: OpenAI + KServe v2 HTTP on one port, KServe v2 gRPC on another; else KServe v2 only."""
    return ["openai", "kserve-grpc"] if options.openai else ["kserve-http", "kserve-grpc"]


async def watch_engine(handle, stop: asyncio.Event, died: list[str], stall_timeout_s: float) -> None:
    """Set `stop` (with the cause in `died`) when the engine stops being able to serve.

    vLLM marks a dead engine core (killed, or crashed in a step) and fails every request after it,
    but its process stays up: without this, /health would say 503 engine-error forever. A hung core
    (alive, answering nothing: stopped, deadlocked, stuck in a step) is marked by nobody: the ping
    finds it, and a server whose engine does not answer for stall_timeout_s is as good as dead.
    """
    loop = asyncio.get_running_loop()
    ping: asyncio.Task | None = None
    sent = 0.0
    next_ping = loop.time() + ENGINE_PING_INTERVAL_S
    try:
        while not stop.is_set():
            if not handle.healthy:
                died.append(handle.failure_cause())
                stop.set()
                return
            now = loop.time()
            if ping is None and now >= next_ping:
                ping, sent = asyncio.create_task(handle.ping()), now
            elif ping is not None and ping.done():
                if not ping.cancelled() and ping.exception() is not None and handle.healthy:
                    log.warning("engine: ping failed: %r", ping.exception())
                ping, next_ping = None, now + ENGINE_PING_INTERVAL_S
            elif ping is not None and now - sent > stall_timeout_s:
                handle.stalled = (
                    f"the engine core has not answered for {now - sent:.0f} s (hung: alive but not serving; "
                    f"the limit is {stall_timeout_s:g} s)"
                )
                continue  # reported as not healthy on the next pass
            await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
    finally:
        if ping is not None:
            # ended here, so that no task holds the engine past its shutdown (AsyncLLM.__del__ at exit)
            ping.cancel()
            with contextlib.suppress(BaseException):
                await ping
            ping = None


class StepLog:
    def __init__(self) -> None:
        self.steps: list[tuple[str, float]] = []

    @contextmanager
    def step(self, name: str, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        log.info("startup: %-11s %s ...", name, what)
        yield
        took = time.perf_counter() - t0
        self.steps.append((name, took))
        log.info("startup: %-11s done in %.2f s", name, took)


async def serve_async(options: ServeOptions, on_ready: Callable[[list[str]], None] | None = None) -> int:
    # The startup steps' modules are imported when the server starts, not with this module: they
    # import llmserve.packaging (about a second, measured with -X importtime), and this module is
    # imported by the CLI for every `llmserve --help`.
    from llmserve.packaging.opened import cache_root, open_package
    from llmserve.serve.engine import merged_engine_args, require_trust, start_engine
    from llmserve.serve.environment import prepare_engine_environment, prepare_metrics_dir, settle_kv_cache_size
    from llmserve.serve.plugin_entry_points import install_plugins, load_check

    names = requested_frontends(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    steps = StepLog()
    started: list = []
    handle = None
    watcher: asyncio.Task | None = None
    died: list[str] = []
    readiness = Readiness()
    try:
        with steps.step("environment", "engine and cache settings"):
            prepare_engine_environment(options.kv_cache_gib)
        with steps.step("package", f"open {options.package}"):
            package = open_package(Path(options.package))
            log.info(
                "startup: package     %s v%s (%s)%s",
                package.manifest.modelId,
                package.manifest.modelVersion,
                package.root,
                " from cache" if package.from_cache else "",
            )
            log.info("startup: package     verified: %s", package.verification)
            if package.discarded:
                log.warning("startup: package     cache entry discarded and unpacked again: %s", package.discarded)
            engine_args = merged_engine_args(package.manifest.engine_args, options.engine_overrides())
            kv_note = settle_kv_cache_size(engine_args)
            if kv_note:
                log.info("startup: package     %s", kv_note)
            trusted = require_trust(engine_args, trusted=options.trust_remote_code, source=str(options.package))
            if trusted:
                log.info(
                    "startup: package     trusted by --trust-remote-code: %s",
                    ", ".join(f"engine.{a.key}" for a in trusted),
                )
        with steps.step("plugins", f"llmserve's own and {len(package.manifest.plugins)} from the package"):
            site = cache_root() / "run" / f"site-{options.port}-{package.manifest.package_name}"
            plugins = install_plugins(package, site)
        with steps.step("metrics-dir", "wipe and set PROMETHEUS_MULTIPROC_DIR"):
            folder = prepare_metrics_dir(options.metrics_dir, options.port)
            log.info("startup: metrics-dir %s", folder)
            metrics = ServerMetrics()
        with steps.step("listen", ", ".join(names)):
            factories = frontend_factories()
            for name in names:
                frontend = factories[name](options, metrics, package)
                await frontend.start(readiness)
                started.append(frontend)
                log.info("startup: listen      %s frontend on %s (not ready)", name, frontend.address)
        if stop.is_set():
            return 0
        with steps.step("engine", "build the vLLM engine"):
            load_check(plugins)
            model_name = options.served_model_name or package.manifest.modelId
            handle = await start_engine(package, model_name, engine_args, options.max_n)
        readiness.set_ready(handle)
        watcher = asyncio.create_task(watch_engine(handle, stop, died, options.stall_timeout_s()))
        metrics.ready.set(1)
        record_steps(metrics, steps.steps)
        total = sum(s for _, s in steps.steps)
        log.info("ready in %.2f s: model '%s' on %s", total, handle.model_name, ", ".join(f.address for f in started))
        if on_ready:
            on_ready([f.address for f in started])
        await stop.wait()
        if died:
            log.error(
                "engine: the vLLM engine died: %s; exiting with exit code %d so that a supervisor restarts the server",
                died[0],
                ExitCode.ENGINE,
            )
            return ExitCode.ENGINE
        log.info("shutdown: signal received; draining in-flight requests (at most %.0f s)", options.drain_timeout_s)
        return 0
    finally:
        if watcher is not None:
            watcher.cancel()
        readiness.set_draining()
        for frontend in started:
            await frontend.drain(min(options.drain_timeout_s, DEAD_ENGINE_DRAIN_S) if died else options.drain_timeout_s)
        if handle is not None:
            handle.shutdown()
            # Drop every reference now, while modules are alive: AsyncLLM.__del__ would otherwise
            # run its shutdown again during interpreter teardown.
            readiness.handle = handle = None
            gc.collect()
        readiness.phase = "stopped"
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if started:
            log.info("shutdown: done")


def serve(options: ServeOptions, on_ready: Callable[[list[str]], None] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; return the process exit code (0 after a clean drain)."""
    from llmserve.packaging.opened import package_manifest  # deferred: imports llmserve.packaging (module doc)
    from llmserve.serve.triton.host import choose_engine, serve_on_triton

    with contextlib.ExitStack() as held:
        options = from_the_store(options, held)
        manifests = [package_manifest(Path(p)) for p in options.packages]
        engine = choose_engine(
            options.engine,
            [m.backend for m in manifests],
            options.triton_url,
            declared={m.modelId: m.engine_host for m in manifests if m.engine_host},
        )
        if engine == "triton":
            return asyncio.run(serve_on_triton(options, on_ready))
        return asyncio.run(serve_async(options, on_ready))


def from_the_store(options: ServeOptions, held: contextlib.ExitStack) -> ServeOptions:
    """The options with every model store reference (s3://...) replaced by its verified package in the store cache,
    pulled once (one process downloads, others wait and reuse it) and held against eviction while `held` is open."""
    refs = [str(p) for p in options.packages if str(p).startswith("s3://")]
    if not refs:
        return options
    from llmserve.store import lease  # deferred: imports boto3 (the store extra), only for s3:// references

    resolved: dict[str, Path] = {}
    for ref in refs:
        t0 = time.perf_counter()
        log.info("startup: store       %s ...", ref)
        lease_held, result = lease(ref, options.store_cache)
        held.callback(lease_held.close)
        resolved[ref] = result.path
        how = f"pulled {result.size:,} bytes" if result.downloaded else "from the cache"
        log.info("startup: store       %s -> %s (%s) in %.2f s", ref, result.path, how, time.perf_counter() - t0)
    paths = [resolved.get(str(p), Path(p)) for p in options.packages]
    return dataclasses.replace(options, package=paths[0], extra_packages=list(paths[1:]))
