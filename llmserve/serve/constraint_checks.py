"""Where a request's constraint is checked (issue #11).

Checking a new constraint compiles it, and what that costs is the client's choice, up to the compile
budgets (llmserve/constraints/limits.py: 2 s of wall-clock time by default). So the check runs:

  * on a few threads of its own (CHECK_THREADS): a burst of new constraints queues here instead of
    taking every core or the event loop's default executor, which every request's other work shares;
  * at a lower CPU priority (CHECK_NICE, Linux's per-thread nice value): when the CPUs are contended,
    the engine and the event loop, which serve every other client, win them. On an idle machine the
    priority changes nothing;
  * for a request that carries a constraint, the whole request check runs there (``request_check``), awaited
    without holding a thread of the default executor: a burst of new schemas once held every default thread
    waiting on the two check threads, and requests without a constraint, whose checks run on the default
    executor, stalled behind them (18 s under 50 new schemas, measured).
What a check found is remembered by the compiler itself (llmserve/constraints/compiler.py): a
constraint that compiled is not compiled again, nor one that was refused, except over the time
budget (it may fit on a less busy machine).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger("llmserve.serve")

CHECK_THREADS = 2
CHECK_NICE = 10  # added to the process's nice value: weight ~1/10 of a normal thread under contention
THREAD_PREFIX = "llmserve-constraint-check"

T = TypeVar("T")

# the check threads (CHECK_THREADS), and one for checks answered from memory ("known"), made at first use
_executors: dict[str, ThreadPoolExecutor] = {}
_executor_lock = threading.Lock()


def _lower_priority() -> None:
    try:
        # on Linux a thread is a task of its own: its id as PRIO_PROCESS changes this thread only
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + CHECK_NICE)
    except (OSError, AttributeError) as exc:  # not Linux, or refused: the checks still run, at normal priority
        log.warning("constraint checks run at normal CPU priority (%s)", exc)


def _pool(known: bool = False) -> ThreadPoolExecutor:
    name, threads = (f"{THREAD_PREFIX}-known", 1) if known else (THREAD_PREFIX, CHECK_THREADS)
    with _executor_lock:
        if name not in _executors:
            _executors[name] = ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=_lower_priority)
        return _executors[name]


def on_check_thread(fn: Callable[..., T], *args: Any, known: bool = False) -> T:
    """fn(*args) on a constraint-check thread, waiting for it (the caller is itself a worker thread,
    never the event loop). Called from a check thread, it runs in place. ``known``: the check of a constraint
    checked before, answered from memory, on a thread of its own that new constraints never queue on."""
    if threading.current_thread().name.startswith(THREAD_PREFIX):
        return fn(*args)
    return _pool(known).submit(fn, *args).result()


async def request_check(fn: Callable[..., T], *args: Any, constrained: bool, **kwargs: Any) -> T:
    """fn(*args, **kwargs) off the event loop: on a constraint-check thread when the request carries a constraint
    (its check may compile it), else on the default executor, never queued behind those."""
    if constrained:
        return await asyncio.wrap_future(_pool().submit(fn, *args, **kwargs))
    return await asyncio.to_thread(fn, *args, **kwargs)
