"""`llmserve serve --engine triton`: packages hosted by a real Triton Inference Server, under llmserve's supervision.

Startup steps (each logged with its duration, as on the embedded engine):
  1. environment  engine/cache settings the models inherit (the vLLM backend reads them in Triton's stub)
  2. package      open every package (verify, unpack into the local cache); refuse code-loading engine arguments
                  unless --trust-remote-code; all packages share one executionMode
  3. metrics-dir  wipe and set PROMETHEUS_MULTIPROC_DIR (vLLM inside Triton writes its metrics there)
     listen       (embedded) bind llmserve's KServe v2 frontends: /health answers 503 "starting"
  4. triton       start `tritonserver` on the packages' model repositories in explicit model-control mode, loading
                  exactly their models; ready when every model is READY (a model that fails to load: its name,
                  Triton's reason and log lines, exit 7)
  5. ready        supervised: Triton exiting, a model leaving READY, or a model's Python-backend stub or vLLM engine
                  core dying (Triton keeps such a model READY), ends llmserve with exit 7 (a supervisor restarts
                  it); SIGTERM/SIGINT stop Triton (in-flight requests drain) and leave no process behind.

executionMode standalone: Triton serves KServe v2 itself on the public ports (--port HTTP, --grpc-port gRPC,
--metrics-port metrics). executionMode embedded: Triton listens on loopback only, and llmserve's KServe v2 HTTP
(--port) and gRPC (--grpc-port) frontends sit in front (grpc_proxy.py, http_proxy.py): the API key, body limits,
/health (503 until every model is READY) and one merged /metrics (llmserve's own, vLLM's multiprocess files and
Triton's endpoint); with --openai, the OpenAI API over Triton on --port too (openai_routes.py).
With --triton-url HOST:PORT (gRPC; --triton-http-url for the KServe HTTP routes) nothing is started: llmserve's
frontends attach to a Triton that already runs (a standalone one elsewhere), ready once it has the packages' models
READY; the packages give the model names and chat templates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmserve.errors import ExitCode, InvalidInputError
from llmserve.serve.options import ServeOptions
from llmserve.serve.triton.backend_settings import (
    ENV_CONSTRAINTS,
    ENV_ENGINE_OVERRIDES,
    ENV_MAX_N,
    ENV_MAX_PROMPT_CHARS,
    ENV_TRUST_REMOTE_CODE,
)

log = logging.getLogger("llmserve.serve")

ENGINES = ("vllm", "triton")
# How often a ready Triton is checked: its process, then its models' readiness (an HTTP call per model).
SUPERVISE_INTERVAL_S = 1.0
# After the engine died, in-flight requests on it never finish: they get this long, and Triton this long to stop.
DEAD_ENGINE_GRACE_S = 3.0
# Loading an LLM in Triton builds the engine (weights, KV cache): minutes on a loaded CPU host.
READY_TIMEOUT_S = 600.0


class EngineChoiceError(InvalidInputError):
    """The engine asked for cannot serve the packages given."""

    code = "serve-engine"


def choose_engine(
    requested: str | None,
    backends: Sequence[str],
    triton_url: str | None = None,
    declared: dict[str, str] | None = None,
) -> str:
    """The engine for packages of these backends: --engine if given (and able), else the host the packages'
    `engine.host` names, else vLLM for one vLLM package, Triton otherwise (a Python-backend model runs only in
    Triton's Python backend). `declared` maps model id -> `engine.host` of the packages that set it."""
    declared = declared or {}
    if requested is None and declared:
        hosts = sorted(set(declared.values()))
        if len(hosts) > 1:
            raise EngineChoiceError(
                "the packages ask for different engine hosts: "
                + ", ".join(f"{m}: {h}" for m, h in sorted(declared.items())),
                hint="Choose one with --engine vllm|triton.",
            )
        requested = hosts[0]
        log.info("engine: %s, as the packages' engine.host asks (--engine overrides it)", requested)
    elif requested is not None and any(h != requested for h in declared.values()):
        log.info("engine: --engine %s overrides the packages' engine.host", requested)
    if requested is not None and requested not in ENGINES:
        raise EngineChoiceError(f"--engine {requested}: unknown engine; choose one of {', '.join(ENGINES)}")
    if triton_url:
        if requested == "vllm":
            raise EngineChoiceError("--triton-url attaches to a Triton: it cannot go with --engine vllm")
        return "triton"
    if requested == "vllm":
        if "python" in backends:
            raise EngineChoiceError(
                "a Python-backend package (custom execute()) runs only in Triton's Python backend, "
                "not on the embedded vLLM engine",
                hint="Serve it with --engine triton (make triton-env builds the Triton environment).",
            )
        if len(backends) > 1:
            raise EngineChoiceError(
                f"the embedded vLLM engine serves one package; {len(backends)} were given",
                hint="Host several packages in one Triton: --engine triton.",
            )
        return "vllm"
    if requested == "triton":
        return "triton"
    return "vllm" if list(backends) == ["vllm"] else "triton"


def execution_mode(modes: dict[str, str]) -> str:
    """The one executionMode of the packages hosted together (model id -> mode)."""
    distinct = sorted(set(modes.values()))
    if len(distinct) != 1:
        raise InvalidInputError(
            "packages hosted in one Triton must share their executionMode; got "
            + ", ".join(f"{m}: {mode}" for m, mode in sorted(modes.items())),
            hint="Set the same `executionMode:` in each llmserve.yaml and package them again.",
        )
    return distinct[0]


def backend_environment(options: ServeOptions) -> dict[str, str]:
    """What llmserve's vLLM backend inside Triton reads (llmserve.serve.triton.vllm_model): the server's limits."""
    overrides = {k: v for k, v in options.engine_overrides().items() if k != "logits_processors"}
    return {
        ENV_MAX_PROMPT_CHARS: str(options.max_prompt_chars),
        ENV_MAX_N: str(options.max_n),
        ENV_CONSTRAINTS: "1" if options.constraints else "0",
        ENV_TRUST_REMOTE_CODE: "1" if options.trust_remote_code else "0",
        ENV_ENGINE_OVERRIDES: json.dumps(overrides),
    }


@dataclass
class TritonHandle:
    """What Readiness holds for a Triton host: healthy while the Triton process runs."""

    triton: Any

    @property
    def healthy(self) -> bool:
        return self.triton.exit_code() is None


async def serve_on_triton(options: ServeOptions, on_ready: Callable[[list[str]], None] | None = None) -> int:
    # deferred, as in llmserve.serve.server: these import llmserve.packaging (about a second)
    from llmserve.serve.environment import prepare_engine_environment, prepare_metrics_dir
    from llmserve.serve.readiness import Readiness
    from llmserve.serve.server import StepLog

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    steps = StepLog()
    triton: Any = None
    readiness = Readiness()
    proxies: list[Any] = []
    died: str | None = None
    try:
        with steps.step("environment", "engine and cache settings"):
            prepare_engine_environment(options.kv_cache_gib)
        with steps.step("package", ", ".join(str(p) for p in options.packages)):
            packages, mode = _open_packages(options)
        with steps.step("metrics-dir", "wipe and set PROMETHEUS_MULTIPROC_DIR"):
            folder = prepare_metrics_dir(options.metrics_dir, options.port)
            log.info("startup: metrics-dir %s", folder)
        metrics = None
        if mode == "embedded":
            from llmserve.serve.metrics import ServerMetrics

            metrics = ServerMetrics()
            openai = await asyncio.to_thread(_openai_settings, packages) if options.openai else None
            with steps.step("listen", "KServe v2 HTTP and gRPC in front of Triton"):
                proxies = await _start_proxies(options, readiness, metrics, openai, packages)
        if stop.is_set():
            return 0
        ids = model_names(packages)
        triton = await _bring_up(options, packages, mode, steps, stop)
        if triton is None:
            return 0
        addresses = _go_ready(triton, proxies, metrics, readiness, options.metrics_timeout_s)
        total = sum(s for _, s in steps.steps)
        log.info(
            "ready in %.2f s: Triton hosts %s (executionMode %s); %s", total, ", ".join(ids), mode, ", ".join(addresses)
        )
        if on_ready:
            on_ready(addresses)
        died = await _supervise(triton, stop)
        if died:
            log.error(
                "triton: %s; exiting with exit code %d so that a supervisor restarts the server",
                died,
                ExitCode.ENGINE,
            )
            return ExitCode.ENGINE
        log.info("shutdown: signal received; draining (in-flight requests get %.0f s)", options.drain_timeout_s)
        return 0
    finally:
        readiness.set_draining()
        grace = min(options.drain_timeout_s, DEAD_ENGINE_GRACE_S) if died else options.drain_timeout_s
        for proxy in proxies:
            await proxy.drain(grace)
        if triton is not None:
            # Embedded: the frontends above have drained every request, so Triton's model unload (cleanup only)
            # gets UNLOAD_GRACE_S; standalone clients talk to Triton itself, and its own drain must run in full.
            from llmserve.serve.triton.server import UNLOAD_GRACE_S

            unload_s = UNLOAD_GRACE_S if mode == "embedded" else None
            await asyncio.to_thread(triton.stop, DEAD_ENGINE_GRACE_S if died else None, unload_s)
            log.info("shutdown: done")
        readiness.phase = "stopped"
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _bring_up(options: ServeOptions, packages: list[Any], mode: str, steps: Any, stop: asyncio.Event) -> Any:
    """The Triton serving the packages, ready (started here, or attached with --triton-url); None after a signal."""
    ids = ", ".join(model_names(packages))
    if options.triton_url:
        from llmserve.serve.triton.remote import RemoteTriton

        with steps.step("triton", f"attach to the Triton at {options.triton_url} ({ids})"):
            remote = RemoteTriton(
                options.triton_url,
                options.triton_http_url,
                model_names(packages),
                ready_timeout=READY_TIMEOUT_S,
            )
            return remote if await _start_unless_stopped(remote, stop) else None
    with steps.step("triton", f"start tritonserver with {ids}"):
        triton = _triton_server(options, packages, mode)
        return triton if await _start_unless_stopped(triton, stop) else None


def _go_ready(triton: Any, proxies: list[Any], metrics: Any, readiness: Any, scrape_timeout_s: float) -> list[str]:
    """Point llmserve's frontends (if any: executionMode embedded) at the ready Triton; where clients connect."""
    if not proxies:
        return [f"KServe v2 HTTP {triton.http_url}", f"gRPC {triton.grpc_url}", f"metrics {triton.metrics_url}"]
    from llmserve.metrics import TritonScrape

    for proxy in proxies:
        if proxy.name == "kserve-http":
            proxy.attach(triton.http_url, triton.grpc_url)
        else:
            proxy.attach(triton.grpc_url)
    if triton.metrics_url:
        metrics.merged.add(TritonScrape(triton.metrics_url, timeout=scrape_timeout_s))
    readiness.set_ready(TritonHandle(triton))
    metrics.ready.set(1)
    return [f"{p.name} {p.address}" for p in proxies]


def model_names(packages: list[Any]) -> list[str]:
    """The Triton models the packages make, in order (versions of one model are one model)."""
    return list(dict.fromkeys(p.manifest.modelId for p in packages))


def refuse_unenforced_options(options: ServeOptions) -> None:
    """Options the Triton host could only drop: refused before anything starts, never ignored."""
    asked = options.stall_timeout_asked_by()
    if asked:
        raise InvalidInputError(
            f"{asked} sets the hang watch of the embedded vLLM engine; a Triton host has none (its engines run "
            "inside Triton's backend stubs, which llmserve cannot ping), so it would not be enforced",
            hint="Drop --engine-stall-timeout / unset LLMSERVE_ENGINE_STALL_TIMEOUT_S with --engine triton, or serve "
            "a vLLM-backend package on the embedded engine (--engine vllm) to have hung engines ended.",
        )
    if options.served_model_name:
        raise InvalidInputError(
            "--served-model-name is not taken with --engine triton: clients name a model by its Triton name, "
            "the package's modelId"
        )


def _open_packages(options: ServeOptions) -> tuple[list[Any], str]:
    """The packages, opened and checked (code-loading engine arguments need --trust-remote-code), and their mode."""
    from llmserve.packaging.opened import open_package
    from llmserve.serve.engine import merged_engine_args, require_trust

    refuse_unenforced_options(options)
    packages = [open_package(Path(p)) for p in options.packages]
    for package in packages:
        manifest = package.manifest
        if package.repository_dir is None:
            raise InvalidInputError(
                f"{package.root}: a source folder has no Triton model repository yet",
                hint=f"Package it first (`llmserve package {package.root}`) and serve the .llmpkg.",
            )
        log.info("startup: package     %s v%s (%s)", manifest.modelId, manifest.modelVersion, package.root)
        if manifest.backend == "vllm":
            merged = merged_engine_args(manifest.engine_args, options.engine_overrides())
            require_trust(merged, trusted=options.trust_remote_code, source=str(package.root))
    given = [(p.manifest.modelId, p.manifest.modelVersion) for p in packages]
    if len(set(given)) != len(given):
        raise InvalidInputError(
            "a package is given twice (same modelId and modelVersion): "
            + ", ".join(f"{m} v{v}" for m, v in sorted(given))
        )
    # attached to a Triton elsewhere, llmserve's frontends are all it runs: the packages' own mode is that Triton's
    mode = (
        "embedded"
        if options.triton_url
        else execution_mode({p.manifest.modelId: p.manifest.executionMode for p in packages})
    )
    if mode == "standalone" and options.api_key:
        raise InvalidInputError(
            "an API key is set, and executionMode standalone serves Triton's own endpoints, which take no key: "
            "it would not be enforced",
            hint="Set `executionMode: embedded` in llmserve.yaml (llmserve's frontends, with the key, in front of "
            "Triton), or serve without a key (unset LLMSERVE_API_KEY, no --api-key-file) where auth is done in front.",
        )
    if options.openai and mode == "standalone":
        raise InvalidInputError(
            "--openai needs llmserve's frontends in front of Triton, and executionMode standalone has none "
            "(Triton serves KServe v2 itself)",
            hint="Set `executionMode: embedded` in llmserve.yaml (the default), or drop --openai.",
        )
    return packages, mode


def _openai_settings(packages: list[Any]) -> Any:
    """The generating models the OpenAI routes serve: vLLM-backend packages and Python-backend packages of the
    llm-text contract, each with its chat template (and, for llm-text, its tokenizer to count tokens)."""
    from llmserve.serve.triton.http_proxy import OpenAISettings
    from llmserve.serve.triton.openai_routes import TritonLLM
    from llmserve.serve.triton.text_protocols import VLLM_TEXT, LlmText

    models = {}
    for package in packages:
        manifest = package.manifest
        if manifest.backend == "vllm":
            models[manifest.modelId] = TritonLLM(manifest.modelId, _chat_renderer(_tokenizer(package)), VLLM_TEXT)
        elif manifest.python is not None and manifest.python.frontend == "llm-text":
            tokenizer = _tokenizer(package)

            def count(text: str, tokenizer: Any = tokenizer) -> int:
                return len(tokenizer(text, add_special_tokens=False)["input_ids"])

            protocol = LlmText(count, decoupled=manifest.python.decoupled)
            models[manifest.modelId] = TritonLLM(manifest.modelId, _chat_renderer(tokenizer), protocol)
    if not models:
        raise InvalidInputError(
            "--openai: none of the packages is a generating model (a vLLM-backend package, or a Python-backend "
            "package with python.frontend: llm-text)"
        )
    key = structured_outputs_key()
    log.info("startup: openai      %s; response_format travels as sampling_parameters '%s'", ", ".join(models), key)
    return OpenAISettings(models, key)


def _tokenizer(package: Any) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(package.weights_dir))
    except (OSError, ValueError) as exc:
        raise InvalidInputError(
            f"--openai: model '{package.manifest.modelId}': no tokenizer loads from its weights ({exc})",
            hint="The OpenAI routes render chat templates and count tokens with the package's tokenizer: package "
            "its tokenizer files beside the weights, or serve it without --openai (KServe v2 only).",
        ) from exc


def _chat_renderer(tokenizer: Any) -> Callable[[list[dict[str, Any]]], str] | None:
    """The chat template as a function of the messages; None when the tokenizer has no template."""
    if not getattr(tokenizer, "chat_template", None):
        return None

    def render(messages: list[dict[str, Any]]) -> str:
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    return render


def structured_outputs_key(lock_path: Path = Path("llmserve.lock")) -> str:
    """The structured-output key of the Triton line's vLLM backend: the lock's pin where one is here, else the key
    of the vLLM llmserve's own backend runs (vLLM 0.32: structured_outputs)."""
    from llmserve.formats.lock import load_lock

    if lock_path.is_file():
        return load_lock(lock_path).interfaces.structuredOutputs.key
    return "structured_outputs"


def _generate_inputs(packages: list[Any]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The generating models whose generate bodies the HTTP proxy rewrites (llm_text_generate.py), name -> their
    input tensor names: Python-backend models of the llm-text contract, and vLLM-backend models."""
    from llmserve.formats.tensors import LLM_TEXT_CONTRACT
    from llmserve.serve.triton.text_protocols import ADDITIONAL_OUTPUTS

    llm_text, vllm = {}, {}
    for package in packages:
        manifest = package.manifest
        python = manifest.python
        if manifest.backend == "python" and python is not None and python.frontend == "llm-text":
            llm_text[manifest.modelId] = [t.name for t in python.tensors.inputs]
        elif manifest.backend == "vllm":
            vllm[manifest.modelId] = [t.name for t in LLM_TEXT_CONTRACT.inputs] + list(ADDITIONAL_OUTPUTS)
    return llm_text, vllm


async def _start_proxies(
    options: ServeOptions, readiness: Any, metrics: Any, openai: Any, packages: list[Any]
) -> list[Any]:
    from llmserve.serve.triton.grpc_proxy import TritonGrpcProxy
    from llmserve.serve.triton.http_proxy import TritonHttpProxy

    llm_text, vllm = _generate_inputs(packages)
    http = TritonHttpProxy(
        options.host,
        options.port,
        api_key=options.api_key,
        max_body_bytes=options.max_body_bytes,
        metrics=metrics.exposition,
        openai=openai,
        llm_text_inputs=llm_text,
        vllm_inputs=vllm,
    )
    grpc = TritonGrpcProxy(
        options.host, options.grpc_port, api_key=options.api_key, max_message_bytes=options.max_body_bytes
    )
    started: list[Any] = []
    try:
        for proxy in (http, grpc):
            await proxy.start(readiness)
            started.append(proxy)
            log.info("startup: listen      %s on %s (not ready)", proxy.name, proxy.address)
    except BaseException:
        for proxy in started:
            await proxy.drain(0)
        raise
    return started


def _triton_server(options: ServeOptions, packages: list[Any], mode: str) -> Any:
    import os

    from llmserve.serve.triton.locate import locate_tritonserver
    from llmserve.serve.triton.server import TritonPorts, TritonServer, free_ports

    install = locate_tritonserver()
    log.info("startup: triton      %s (found by %s)", install.binary, install.found_by)
    if mode == "standalone":  # Triton's own endpoints are the public ones
        host = options.host
        wanted = [options.port, options.grpc_port, options.metrics_port]
    else:  # behind llmserve's frontends: loopback only, any free ports
        host = "127.0.0.1"
        wanted = [0, 0, 0]
    spare = iter(free_ports(host, wanted.count(0)))
    from llmserve.packaging.opened import cache_root
    from llmserve.serve.triton.repository import hosting_repositories

    repositories = hosting_repositories(packages, cache_root() / "run" / f"triton-{options.port}")
    return TritonServer(
        repositories,
        model_names(packages),
        install=install,
        host=host,
        ports=TritonPorts(*[p or next(spare) for p in wanted]),
        ready_timeout=READY_TIMEOUT_S,
        stop_timeout=options.drain_timeout_s,
        environ={**os.environ, **backend_environment(options)},
    )


async def _start_unless_stopped(triton: Any, stop: asyncio.Event) -> bool:
    """Start Triton (blocking, on a thread); False if a signal came first (what was starting is stopped)."""
    start = asyncio.ensure_future(asyncio.to_thread(triton.start))
    signalled = asyncio.ensure_future(stop.wait())
    await asyncio.wait({start, signalled}, return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    if not start.done():
        await asyncio.to_thread(triton.stop)
        await asyncio.gather(start, return_exceptions=True)
        return False
    start.result()
    return True


async def _supervise(triton: Any, stop: asyncio.Event) -> str | None:
    """Wait for a signal (None) or for Triton to stop serving (why). A Python-backend stub that dies (kill -9, out
    of memory) is not restarted by Triton: its model stays READY and fails every request ("Stub process is not
    healthy"), so a stub gone counts as the engine gone; so does a vLLM engine core a stub started."""
    stubs = await asyncio.to_thread(triton.python_stubs) if hasattr(triton, "python_stubs") else {}
    # a vLLM-backend model's engine core, killed, leaves the model READY in Triton and failing every request too
    cores = await asyncio.to_thread(triton.engine_cores) if hasattr(triton, "engine_cores") else {}
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), SUPERVISE_INTERVAL_S)
            return None
        except TimeoutError:
            pass
        code = triton.exit_code()
        if code is not None:
            return f"tritonserver exited with code {code} (its log: {triton.log_path})"
        if stubs:
            alive = await asyncio.to_thread(triton.python_stubs)
            for pid, model in stubs.items():
                if pid not in alive and triton.exit_code() is None:
                    return (
                        f"the Python-backend stub of model '{model}' (pid {pid}) died; Triton does not restart it, "
                        f"so '{model}' cannot answer (Triton's log: {triton.log_path})"
                    )
        if cores:
            alive = await asyncio.to_thread(triton.engine_cores)
            for pid, model in cores.items():
                if pid not in alive and triton.exit_code() is None:
                    return (
                        f"the vLLM engine core of model '{model}' (pid {pid}) died; its model stays READY in Triton "
                        f"but cannot answer (Triton's log: {triton.log_path})"
                    )
        for model in triton.models:
            if not await asyncio.to_thread(triton.is_model_ready, model) and triton.exit_code() is None:
                return f"model '{model}' is no longer ready in Triton (its log: {triton.log_path})"
    return None
