"""The embedded vLLM engine: one AsyncLLM built from the package's engine arguments.

vLLM 0.32's AsyncLLM lives in this process; it runs the model in one engine-core child process
(the V1 architecture has no in-thread async engine). The OpenAI serving objects vLLM's own server
uses (chat, completion, embedding, models) are built here on the same AsyncLLM, in this process,
so every frontend shares one engine and one KV cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from starlette.datastructures import State

from llmserve.formats.engine_trust import CodeArg, require_code_trust
from llmserve.packaging.opened import OpenedPackage
from llmserve.serve.constraint_keys import LLMSERVE_BACKEND, STRUCTURED_BACKENDS, ConstraintSupport
from llmserve.serve.errors import EngineArgsError, StartupError
from llmserve.serve.options import (
    ADDITIVE_ENGINE_ARGS,
    CONSTRAINT_PROCESSOR,
    DEFAULT_MAX_N,
    OVERRIDABLE_ENGINE_ARGS,
)

log = logging.getLogger("llmserve.serve")

# vLLM's own structured outputs, used only with --structured-outputs-backend set to one of vLLM's backends
# (by default llmserve's constraint processor serves them and vLLM's config is unused). As measured on the
# CPU build: guidance without free whitespace keeps a random-weight model inside valid, short JSON
# (xgrammar let raw control characters into strings).
STRUCTURED_OUTPUTS_DEFAULT = {"backend": "guidance", "disable_any_whitespace": True}
# The engine argument (an override of `llmserve serve --structured-outputs-backend`, never vLLM's) naming
# who serves structured outputs: "llmserve" (default) or one of vLLM's backends.
STRUCTURED_BACKEND_ARG = "structured_outputs_backend"
_WHITESPACE_BACKENDS = ("xgrammar", "guidance")  # the vLLM backends that take disable_any_whitespace
# Measured defaults for the embedded CPU engine (a manifest value wins).
ENGINE_DEFAULTS = {"enforce_eager": True}


@dataclass
class EngineHandle:
    """What frontends get: the engine, vLLM's serving objects and facts about the model."""

    engine: Any  # vllm.v1.engine.async_llm.AsyncLLM
    state: Any  # starlette State holding vLLM's serving objects (openai_serving_chat, ...)
    model_name: str
    supported_tasks: tuple[str, ...]
    max_model_len: int
    # whether llmserve's constraint processor runs in this engine (and why not): what the frontends
    # check a constrained request against
    constraints: ConstraintSupport
    engine_args: dict[str, Any] = field(default_factory=dict)
    # the server's request limits the frontends enforce (400 above): most choices per request
    max_n: int = DEFAULT_MAX_N

    @property
    def generates(self) -> bool:
        return "generate" in self.supported_tasks

    @property
    def embeds(self) -> bool:
        return "embed" in self.supported_tasks

    # set by the server's engine watch when the engine core stopped answering (hung: alive, but no answer)
    stalled: str | None = None

    @property
    def healthy(self) -> bool:
        return not self.engine.errored and self.stalled is None

    async def ping(self) -> None:
        """A no-op round trip through the engine core: a utility call it answers between two engine steps
        (vLLM's is_sleeping). It never returns from a core that is hung (stopped, deadlocked, stuck in a step)."""
        await self.engine.is_sleeping()

    def failure_cause(self) -> str:
        """Why the engine stopped, as far as this process can tell (the engine core logs its own traceback)."""
        if self.stalled is not None:
            return self.stalled
        resources = getattr(getattr(self.engine, "engine_core", None), "resources", None)
        manager = getattr(resources, "engine_manager", None)
        try:
            exited = manager.finished_procs() if manager is not None else {}
        except Exception as exc:  # best effort: this runs on a dead engine
            log.debug("engine processes not readable: %s", exc)
            exited = {}
        if exited:
            return "; ".join(f"{name} process exited with {_exit_status(code)}" for name, code in exited.items())
        if resources is not None and getattr(resources, "engine_dead", False):
            return "the engine core reported a fatal error (EngineDeadError; its traceback is logged above)"
        return "the engine's output loop stopped (its traceback is logged above)"

    def shutdown(self) -> None:
        shut_down(self.engine)


def shut_down(engine: Any) -> None:
    """``engine.shutdown()``, once. AsyncLLM.__del__ shuts down again when the object is collected;
    vLLM's serving objects (and a finished build's frame) hold it past the server's cleanup, often
    until interpreter teardown, where that second shutdown fails on vLLM's cleared module globals (a
    TypeError traceback after every clean stop). Once shut down, it has nothing left to do there."""
    engine.shutdown()
    cls = type(engine)
    quiet = _WITHOUT_DEL.get(cls)
    if quiet is None:
        quiet = _WITHOUT_DEL[cls] = type(
            cls.__name__, (cls,), {"__del__": lambda self: None, "__module__": cls.__module__}
        )
    engine.__class__ = quiet


_WITHOUT_DEL: dict[type, type] = {}  # an engine class -> the same without __del__ (shut_down)


def _exit_status(code: int | None) -> str:
    if code is None:
        return "an unknown status"
    return f"signal {-code}" if code < 0 else f"code {code}"


def require_trust(engine_args: dict[str, Any], *, trusted: bool, source: str) -> list[CodeArg]:
    """The code-loading engine arguments of the package (UntrustedCodeError unless `trusted`).

    Checked on the merged arguments the engine gets, less what the server itself adds: llmserve's
    constraint processor is the operator's choice (--constraints), not the package's.
    """
    own = dict(engine_args)
    procs = [p for p in own.get("logits_processors") or [] if p != CONSTRAINT_PROCESSOR]
    own["logits_processors"] = procs or None
    return require_code_trust(own, trusted=trusted, source=source)


def merged_engine_args(manifest_engine: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    overrides = dict(overrides)
    backend = overrides.pop(STRUCTURED_BACKEND_ARG, None) or LLMSERVE_BACKEND
    if backend not in STRUCTURED_BACKENDS:
        raise EngineArgsError(
            f"--structured-outputs-backend {backend!r} is not one of {', '.join(STRUCTURED_BACKENDS)}"
        )
    added = {k: overrides.pop(k) for k in ADDITIVE_ENGINE_ARGS if k in overrides}
    bad = sorted(set(overrides) - set(OVERRIDABLE_ENGINE_ARGS))
    if bad:
        raise EngineArgsError(
            f"engine setting(s) {', '.join(bad)} cannot be overridden at serve time; "
            f"overridable: {', '.join(OVERRIDABLE_ENGINE_ARGS)}"
        )
    args = {**ENGINE_DEFAULTS, **manifest_engine, **overrides}
    for key, extra in added.items():  # appended to the package's own list, never replacing it
        own = list(args.get(key) or [])
        args[key] = own + [x for x in extra if x not in own]
    so = dict(STRUCTURED_OUTPUTS_DEFAULT)
    so.update(args.get("structured_outputs_config") or {})
    if backend != LLMSERVE_BACKEND:  # the command line's choice wins over the package's
        so["backend"] = backend
        if backend not in _WHITESPACE_BACKENDS:
            so.pop("disable_any_whitespace", None)
    args["structured_outputs_config"] = so
    args[STRUCTURED_BACKEND_ARG] = backend
    return args


def _vllm_namespace(package: OpenedPackage, model_name: str, engine_args: dict[str, Any]) -> Any:
    # vLLM (and torch under it) is imported only once a server starts: `llmserve --help` stays fast
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    argv = [
        "--model",
        str(package.weights_dir),
        "--served-model-name",
        model_name,
        "--structured-outputs-config",
        json.dumps(engine_args["structured_outputs_config"]),
    ]
    ns = parser.parse_args(argv)
    known = {f for f in AsyncEngineArgs.__dataclass_fields__}
    unknown = sorted(k for k in engine_args if k not in known and k != STRUCTURED_BACKEND_ARG)
    if unknown:
        raise EngineArgsError(f"llmserve.yaml engine: unknown vLLM engine argument(s): {', '.join(unknown)}")
    for key, value in engine_args.items():
        if key not in ("structured_outputs_config", STRUCTURED_BACKEND_ARG):
            setattr(ns, key, value)
    ns.enable_log_requests = False
    return ns


def _processor_plugin_installed() -> bool:
    """The constraint processor is registered in the `vllm.logits_processors` entry-point group
    (a package plugin): vLLM loads it from there, so it must not be given a second time."""
    return any(
        ep.value.replace(" ", "") == CONSTRAINT_PROCESSOR
        for ep in metadata.entry_points(group="vllm.logits_processors")
    )


def _settle_constraint_processor(eargs) -> None:
    """Keep the constraint processor in the engine's logits processors only where vLLM can run it.

    Pooling models and speculative decoding reject custom logits processors: the processor is left
    out there (logged; a request carrying a constraint then gets a 400 saying why). With the V2
    model runner forced on, starting would fail inside vLLM: refuse here with the way out.
    """
    procs = list(eargs.logits_processors or [])
    if CONSTRAINT_PROCESSOR not in procs:
        return
    procs.remove(CONSTRAINT_PROCESSOR)
    if _processor_plugin_installed():
        eargs.logits_processors = procs or None
        return
    why = None
    if eargs.speculative_config:
        why = "speculative decoding is on, and vLLM runs no custom logits processors with it"
    else:
        try:
            if eargs.create_model_config().runner_type == "pooling":
                why = "a pooling model: vLLM runs no logits processors on it"
        except Exception as exc:
            log.debug("model config not readable before the engine build: %s", exc)
    if why:
        log.info("startup: engine      constraint processor left out: %s", why)
        eargs.logits_processors = procs or None
        return
    from llmserve.constraints.vllm_processor import check_engine_env  # imports vLLM: only when serving

    problems = check_engine_env()
    if problems:
        raise EngineArgsError(
            "; ".join(problems), hint="Unset VLLM_USE_V2_MODEL_RUNNER, or serve with --no-constraints."
        )


def constraint_status(engine: Any) -> ConstraintSupport:
    """Whether the constraint processor runs in `engine` (and why not), from the engine's own configuration."""
    mc = engine.model_config
    if mc.runner_type == "pooling":
        return ConstraintSupport(False, "this is a pooling model")
    if getattr(engine.vllm_config, "speculative_config", None):
        return ConstraintSupport(False, "speculative decoding is on")
    for proc in mc.logits_processors or []:
        path = proc if isinstance(proc, str) else f"{proc.__module__}:{proc.__qualname__}"
        if path == CONSTRAINT_PROCESSOR:
            return ConstraintSupport(True)
    if _processor_plugin_installed():
        return ConstraintSupport(True)
    return ConstraintSupport(False, "the server was started with --no-constraints")


def _register_vocab(engine: Any) -> None:
    from llmserve.constraints.vllm_processor import register_vocab, vocab_for_model  # imports vLLM: serving only

    register_vocab(vocab_for_model(engine.vllm_config))


def build_engine(package: OpenedPackage, model_name: str, engine_args: dict[str, Any]):
    """Construct AsyncLLM (blocking: loads weights, profiles, allocates the KV cache)."""
    # deferred like every vLLM import here (a fast `llmserve --help`)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from llmserve.serve.vllm_patches import check_before_engine

    for patch in check_before_engine():
        log.info("startup: engine      vLLM patch %s", patch)
    ns = _vllm_namespace(package, model_name, engine_args)
    try:
        eargs = AsyncEngineArgs.from_cli_args(ns)
    except (ValueError, TypeError) as exc:
        raise EngineArgsError(f"vLLM refused the engine arguments: {exc}") from exc
    _settle_constraint_processor(eargs)
    try:
        engine = AsyncLLM.from_engine_args(eargs, usage_context=UsageContext.OPENAI_API_SERVER)
    except (ValueError, TypeError) as exc:
        raise EngineArgsError(f"vLLM refused the engine arguments: {exc}") from exc
    except Exception as exc:
        raise StartupError(f"the vLLM engine failed to start: {type(exc).__name__}: {exc}") from exc
    return engine, ns


async def attach_serving(
    engine, ns, model_name: str, engine_args: dict[str, Any], max_n: int = DEFAULT_MAX_N
) -> EngineHandle:
    """Build vLLM's OpenAI serving objects on the engine (chat templates, tokenizer, renderers)."""
    # deferred like every vLLM import here
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state

    tasks = tuple(await engine.get_supported_tasks())
    state = State()
    await init_app_state(engine, state, ns, tasks)
    structured = engine_args.get(STRUCTURED_BACKEND_ARG) or LLMSERVE_BACKEND
    constraints = dataclasses.replace(constraint_status(engine), structured=structured)
    if constraints.loaded:
        # the frontends check a constraint's budget against max_tokens before the engine runs it: they
        # need the vocabulary here (the processor itself lives in the engine-core process)
        await asyncio.to_thread(_register_vocab, engine)
        log.info(
            "startup: engine      constraint processor loaded (%s): requests may carry "
            "constraint keys (OpenAI vllm_xargs, KServe sampling_parameters)",
            CONSTRAINT_PROCESSOR,
        )
    else:
        log.info(
            "startup: engine      constraint processor not loaded: %s; a request carrying a "
            "constraint gets HTTP 400 / INVALID_ARGUMENT",
            constraints.reason,
        )
    if structured == LLMSERVE_BACKEND:
        log.info(
            "startup: engine      structured outputs (response_format, structured_outputs) served by "
            "llmserve's constraint processor%s",
            "" if constraints.loaded else " (not loaded: such requests get HTTP 400 / INVALID_ARGUMENT)",
        )
    else:
        log.info(
            "startup: engine      structured outputs (response_format, structured_outputs) served by vLLM's "
            "'%s' backend (--structured-outputs-backend); constraint keys by llmserve's processor",
            structured,
        )
    return EngineHandle(
        engine=engine,
        state=state,
        model_name=model_name,
        supported_tasks=tasks,
        max_model_len=engine.model_config.max_model_len,
        engine_args=engine_args,
        constraints=constraints,
        max_n=max_n,
    )


async def start_engine(
    package: OpenedPackage, model_name: str, engine_args: dict[str, Any], max_n: int = DEFAULT_MAX_N
) -> EngineHandle:
    # Built in a worker thread so the event loop keeps answering /health (503) meanwhile.
    engine, ns = await asyncio.to_thread(build_engine, package, model_name, engine_args)
    try:
        return await attach_serving(engine, ns, model_name, engine_args, max_n)
    except Exception:
        shut_down(engine)
        raise
