"""Run one KServe v2 generation on the shared AsyncLLM.

Streamed text comes from vLLM's own incremental detokenizer with RequestOutputKind.DELTA (a
non-streaming call asks for FINAL_ONLY: one output with the whole text). Each delta is whole characters (a byte-level BPE token that ends mid-character is held back until the character
completes), so streamed pieces never split UTF-8. The prompt is rendered by the engine's renderer
(the same tokenization vLLM's completions API uses), with the context-length check done there.
Closing the async iterator (client cancel, disconnect, deadline) aborts the request in the engine.

vLLM is imported inside the functions, on the first request: the frontends that import this module
open their ports (answering "starting") before the engine step, and importing vLLM takes seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from llmserve.serve.kserve.errors import UNAVAILABLE, KServeError, internal, invalid
from llmserve.serve.kserve.protocol import GenerationRequest

log = logging.getLogger("llmserve.serve.kserve")


@dataclass
class Delta:
    text: str
    final: bool
    finish_reason: str | None = None
    prompt_tokens: int = 0  # the prompt's length in tokens
    output_tokens: int = 0  # tokens this delta adds (the whole output's, for a final-only answer)


def _sampling_params(req: GenerationRequest, whole: bool):
    from vllm.exceptions import VLLMClientError  # deferred, as every vLLM import here (module docstring)
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    kind = RequestOutputKind.FINAL_ONLY if whole else RequestOutputKind.DELTA
    try:
        return SamplingParams(**req.settings.sampling, output_kind=kind)
    except (VLLMClientError, ValueError, TypeError) as exc:
        raise invalid(f"sampling settings refused by the engine: {_engine_message(exc)}") from None


def _engine_message(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).split(" (parameter=")[0]


def _map_engine_error(exc: BaseException) -> KServeError:
    from vllm.exceptions import VLLMClientError

    dead: tuple[type[BaseException], ...] = ()
    try:
        from vllm.v1.engine.exceptions import EngineDeadError

        dead = (EngineDeadError,)
    except ImportError:  # pragma: no cover - moved in another vLLM
        pass
    if isinstance(exc, dead):
        return KServeError(UNAVAILABLE, "the engine has stopped; the server must be restarted")
    if isinstance(exc, (VLLMClientError, ValueError, TypeError, NotImplementedError)):
        return invalid(f"request refused by the engine: {_engine_message(exc)}")
    log.error("generation failed", exc_info=exc)
    return internal("generation")


async def generate(
    handle: Any, req: GenerationRequest, request_id: str | None = None, *, whole: bool = False
) -> AsyncGenerator[Delta, None]:
    """Yield text deltas (or, whole=True, one final text); the last one has final=True. Errors are KServeError."""
    from vllm.renderers.inputs.preprocess import parse_model_prompt

    engine = handle.engine
    params = _sampling_params(req, whole)
    if req.settings.priority:
        policy = getattr(getattr(engine.vllm_config, "scheduler_config", None), "policy", None)
        if policy != "priority":  # vLLM would ignore it under fcfs: refuse rather than drop it
            raise invalid(
                f"request parameter 'priority' needs the engine's priority scheduling, but this engine "
                f"schedules '{policy}'; set `scheduling_policy: priority` under engine: in llmserve.yaml, "
                "or send priority 0"
            )
    rid = f"kserve-{request_id or ''}-{uuid.uuid4().hex}"
    try:
        tok = dataclasses.replace(engine.renderer.default_cmpl_tok_params, max_output_tokens=params.max_tokens or 0)
        (engine_input,) = await engine.renderer.render_cmpl_async(
            [parse_model_prompt(engine.model_config, {"prompt": req.prompt})], tok
        )
    except Exception as exc:
        raise _map_engine_error(exc) from None
    stream = engine.generate(engine_input, params, rid, priority=req.settings.priority)
    try:
        while True:
            try:
                out = await stream.__anext__()
            except StopAsyncIteration:
                return
            except Exception as exc:
                cause = exc.__cause__ if type(exc).__name__ == "EngineGenerateError" and exc.__cause__ else exc
                raise _map_engine_error(cause) from None
            completion = out.outputs[0]
            prompt_tokens = len(out.prompt_token_ids or ())
            yield Delta(
                completion.text, out.finished, completion.finish_reason, prompt_tokens, len(completion.token_ids)
            )
            if out.finished:
                return
    finally:
        await stream.aclose()


async def generate_text(handle: Any, req: GenerationRequest, request_id: str | None = None) -> str:
    """The whole text of a non-streaming request (prompt prepended unless excluded)."""
    parts = [d.text async for d in generate(handle, req, request_id, whole=True)]
    text = "".join(parts)
    if req.exclude_input is not True:
        text = req.prompt + text
    return text


async def generate_deltas(
    handle: Any, req: GenerationRequest, request_id: str | None = None
) -> AsyncGenerator[Delta, None]:
    """What a streaming call sends: one response per non-empty delta, then always a final one.

    The prompt is sent first (prefixed to the first delta) only when exclude_input_in_output is
    explicitly false. With stream=false a streaming call gets one final response with the full text.
    """
    if not req.stream:
        parts = [d async for d in generate(handle, req, request_id, whole=True)]
        text = "".join(p.text for p in parts)
        text = text if req.exclude_input is True else req.prompt + text
        yield dataclasses.replace(parts[-1], text=text, output_tokens=sum(p.output_tokens for p in parts))
        return
    prefix = req.prompt if req.exclude_input is False else ""
    tokens = 0  # of deltas not sent (no text yet: the detokenizer holds a partial character back), counted on
    async for d in generate(handle, req, request_id):
        text = prefix + d.text
        prefix = ""
        tokens += d.output_tokens
        if text or d.final:
            yield dataclasses.replace(d, text=text, output_tokens=tokens)
            tokens = 0
