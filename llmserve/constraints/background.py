"""One background thread per process for work a request must not wait for: calls run one at a time,
in the order submitted, so a burst of new constraints queues there instead of taking every core
(and ``compile_mb`` of memory each) from decoding at once.

At exit the calls not started are dropped and the running one is waited for (``close``): a daemon
thread still inside a native call that released the GIL when the interpreter finalises is ended
by a forced unwind through that call's GIL guard, which aborts the process.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Background:
    """Runs submitted calls on one daemon thread (started on first use, and again in a forked child,
    which has not got the parent's thread nor its queue). ``max_pending``: calls waiting beyond that
    many are dropped (``submit`` says so); 0: no bound."""

    def __init__(self, name: str, max_pending: int = 0) -> None:
        self._name = name
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._idle = threading.Event()
        self._idle.set()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """A forked child has not got the parent's thread, and the parent's calls are not its own to
        run; the lock is new too (another thread may have held it at the fork)."""
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._pending = 0
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, call: Callable[[], None], *, bounded: bool = True) -> bool:
        """Queue ``call``; False when it was dropped (closed, or ``max_pending`` calls waiting and
        ``bounded``)."""
        with self._lock:
            if self._closed or (bounded and self._max_pending and self._pending >= self._max_pending):
                return False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, args=(self._queue,), name=self._name, daemon=True)
                self._thread.start()
            self._pending += 1
            self._queue.put(call)
            return True

    def _run(self, calls: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            call = calls.get()
            with self._lock:  # close() either sees this call running or it never starts
                self._pending -= 1
                if self._closed:
                    continue
                self._idle.clear()
            try:
                call()
            except Exception:  # one failed job must not stop the ones after it
                log.exception("background job %s failed", getattr(call, "__name__", call))
            finally:
                self._idle.set()

    def drain(self, timeout: float) -> bool:
        """Wait until every call submitted so far has run (tests); False when ``timeout`` passed first."""
        done = threading.Event()
        if not self.submit(done.set, bounded=False):  # closed
            return False
        return done.wait(timeout)

    def close(self, timeout: float) -> None:
        """At exit: start nothing more, and wait up to ``timeout`` for the call running now."""
        with self._lock:
            self._closed = True
        self._idle.wait(timeout)
