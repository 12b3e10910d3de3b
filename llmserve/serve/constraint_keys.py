"""The request keys of llmserve's constraint processor, as every frontend checks them.

A request carries at most one constraint, under one of CONSTRAINT_KEYS; it reaches the processor
(llmserve.constraints.vllm_processor) in SamplingParams.extra_args. The OpenAI frontend takes the keys
from `vllm_xargs`, the KServe v2 frontends from `sampling_parameters` or the request parameters; both
ask this module whether the engine they serve can honour them (`constraint_problem`) and, KServe, whether the
constraint itself is valid (`validation_problem`, the processor's own check). A constraint sent to a
server without the processor is refused: vLLM would otherwise ignore the extra args, an unconstrained
answer with a success status.

Problems are returned as one-line messages naming the key; each frontend wraps them in its own error
shape (OpenAI: HTTP 400 on `vllm_xargs`; KServe: INVALID_ARGUMENT / HTTP 400).

Checking a new constraint compiles it (up to the compile time budget, LLMSERVE_CONSTRAINT_COMPILE_MS),
so async frontends call `validation_problem_async`, which runs the check on a small pool of worker
threads: the event loop keeps serving /health and other requests meanwhile. The compiled automaton
is kept (memory and disk cache), so vLLM's own validate_params and the engine reuse it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

# Threads that check constraints: a few, so that a burst of new constraints queues here rather than
# taking every core (or the event loop's default executor, which other work shares).
CHECK_THREADS = 2
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()

# = ("constraint", *llmserve.constraints.vllm_processor.FLAT_KEYS); importing that module imports vLLM.
CONSTRAINT_KEYS = ("constraint", "constraint_regex", "constraint_choice", "constraint_json_schema")


@dataclass(frozen=True)
class ConstraintSupport:
    """Whether an engine runs the constraint processor, and why not: read from the engine's own
    configuration at startup and carried by its EngineHandle (llmserve/serve/engine.py), so each
    frontend asks the engine it serves rather than a process-wide flag."""

    loaded: bool
    reason: str = ""


def given_keys(values: dict[str, Any]) -> list[str]:
    """The constraint keys set (not null) in `values`, in CONSTRAINT_KEYS order."""
    return [k for k in CONSTRAINT_KEYS if values.get(k) is not None]


def shape_problem(key: str, value: Any) -> str | None:
    """A value of the wrong JSON type for its key, or None."""
    if key == "constraint" and not isinstance(value, (dict, str)):
        return 'key \'constraint\' must be an object (or the object as a JSON string), e.g. {"regex": "[0-9]+"}'
    if key == "constraint_regex" and not isinstance(value, str):
        return "key 'constraint_regex' must be a string"
    if key == "constraint_choice" and (
        not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value)
    ):
        return "key 'constraint_choice' must be a non-empty array of strings"
    if key == "constraint_json_schema" and not isinstance(value, (dict, str)):
        return "key 'constraint_json_schema' must be a JSON Schema object (or the schema as a JSON string)"
    return None


def constraint_problem(values: dict[str, Any], support: ConstraintSupport) -> str | None:
    """What stops the engine behind `support` honouring the constraint keys in `values` (other keys are
    not looked at): more than one constraint, no processor on it, or a value of the wrong type. None if fine."""
    given = given_keys(values)
    if len(given) > 1:
        return f"give one constraint per request, got {given}"
    if not given:
        return None
    if not support.loaded:
        return f"key '{given[0]}': the constraint processor is not loaded on this server ({support.reason})"
    return shape_problem(given[0], values[given[0]])


def validation_problem(key: str, value: Any) -> str | None:
    """The constraint processor's own check of one constraint (what its validate_params runs when
    vLLM admits the request), reported with the key; None if valid. Only the processor's
    ConstraintError is the client's fault; anything else it raises propagates (a server fault).
    Imports vLLM."""
    # deferred to the first constrained request: the processor module imports vLLM (seconds), and
    # the frontends import this module before the engine step
    from llmserve.constraints.errors import ConstraintError
    from llmserve.constraints.vllm_processor import request_constraint, validate_constraint

    try:
        obj = request_constraint({key: value})
        if obj is not None:
            validate_constraint(obj)
    except ConstraintError as exc:
        return f"key '{key}': invalid constraint: {exc.message}"
    return None


async def validation_problem_async(key: str, value: Any) -> str | None:
    """`validation_problem` on a worker thread (see the module doc): the caller's event loop is free
    while the constraint compiles."""
    return await asyncio.get_running_loop().run_in_executor(_check_executor(), validation_problem, key, value)


def _check_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="llmserve-constraint-check")
        return _executor


def extra_args_value(value: Any) -> Any:
    """The form a constraint value travels in extra_args: objects as JSON text (vLLM's `vllm_xargs`
    carries only strings, numbers and lists of those; the processor parses the text back)."""
    return json.dumps(value) if isinstance(value, dict) else value
