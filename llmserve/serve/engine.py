"""The embedded vLLM engine: one AsyncLLM built from the package's engine arguments.

vLLM 0.32's AsyncLLM lives in this process; it runs the model in one engine-core child process
(the V1 architecture has no in-thread async engine). The OpenAI serving objects vLLM's own server
uses (chat, completion, embedding, models) are built here on the same AsyncLLM, in this process,
so every frontend shares one engine and one KV cache.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from llmserve.packaging.local import OpenedPackage
from llmserve.serve.errors import EngineArgsError, StartupError
from llmserve.serve.options import OVERRIDABLE_ENGINE_ARGS

log = logging.getLogger("llmserve.serve")

# Structured outputs as measured on the CPU build: guidance without free whitespace keeps a
# random-weight model inside valid, short JSON (xgrammar let raw control characters into strings).
STRUCTURED_OUTPUTS_DEFAULT = {"backend": "guidance", "disable_any_whitespace": True}
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
    engine_args: dict[str, Any] = field(default_factory=dict)

    @property
    def generates(self) -> bool:
        return "generate" in self.supported_tasks

    @property
    def embeds(self) -> bool:
        return "embed" in self.supported_tasks

    @property
    def healthy(self) -> bool:
        return not self.engine.errored

    def shutdown(self) -> None:
        self.engine.shutdown()


def merged_engine_args(manifest_engine: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    bad = sorted(set(overrides) - set(OVERRIDABLE_ENGINE_ARGS))
    if bad:
        raise EngineArgsError(f"engine setting(s) {', '.join(bad)} cannot be overridden at serve time; "
                              f"overridable: {', '.join(OVERRIDABLE_ENGINE_ARGS)}")
    args = {**ENGINE_DEFAULTS, **manifest_engine, **overrides}
    so = dict(STRUCTURED_OUTPUTS_DEFAULT)
    so.update(args.get("structured_outputs_config") or {})
    args["structured_outputs_config"] = so
    return args


def _vllm_namespace(package: OpenedPackage, model_name: str, engine_args: dict[str, Any]):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    argv = ["--model", str(package.weights_dir), "--served-model-name", model_name,
            "--structured-outputs-config", json.dumps(engine_args["structured_outputs_config"])]
    ns = parser.parse_args(argv)
    known = {f for f in AsyncEngineArgs.__dataclass_fields__}
    unknown = sorted(k for k in engine_args if k not in known)
    if unknown:
        raise EngineArgsError(f"llmserve.yaml engine: unknown vLLM engine argument(s): {', '.join(unknown)}")
    for key, value in engine_args.items():
        if key != "structured_outputs_config":
            setattr(ns, key, value)
    ns.enable_log_requests = False
    return ns


def build_engine(package: OpenedPackage, model_name: str, engine_args: dict[str, Any]):
    """Construct AsyncLLM (blocking: loads weights, profiles, allocates the KV cache)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    ns = _vllm_namespace(package, model_name, engine_args)
    try:
        eargs = AsyncEngineArgs.from_cli_args(ns)
        engine = AsyncLLM.from_engine_args(eargs, usage_context=UsageContext.OPENAI_API_SERVER)
    except (ValueError, TypeError) as exc:
        raise EngineArgsError(f"vLLM refused the engine arguments: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the engine's own failure, reported as a startup error
        raise StartupError(f"the vLLM engine failed to start: {type(exc).__name__}: {exc}") from exc
    return engine, ns


async def attach_serving(engine, ns, model_name: str, engine_args: dict[str, Any]) -> EngineHandle:
    """Build vLLM's OpenAI serving objects on the engine (chat templates, tokenizer, renderers)."""
    from starlette.datastructures import State
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state

    tasks = tuple(await engine.get_supported_tasks())
    state = State()
    await init_app_state(engine, state, ns, tasks)
    return EngineHandle(engine=engine, state=state, model_name=model_name, supported_tasks=tasks,
                        max_model_len=engine.model_config.max_model_len, engine_args=engine_args)


async def start_engine(package: OpenedPackage, model_name: str, engine_args: dict[str, Any]) -> EngineHandle:
    # Built in a worker thread so the event loop keeps answering /health (503) meanwhile.
    engine, ns = await asyncio.to_thread(build_engine, package, model_name, engine_args)
    try:
        return await attach_serving(engine, ns, model_name, engine_args)
    except Exception:
        engine.shutdown()
        raise
