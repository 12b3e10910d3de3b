"""Background completion of lazily compiled constraints, and their cache files.

One thread per process waits inside the native core (``finished_next``, without the GIL) and
computes the remaining rows there, alone (the pool stays free for batch fills); it only takes the
GIL once a constraint is complete, to write its file. Queueing is a native call, so it adds nothing
to the compile that queues: no thread to start, no GIL handoff.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from pathlib import Path

from llmserve.constraints.compiled import CompiledConstraint, Completion
from llmserve.constraints.disk_cache import try_write_cache
from llmserve.constraints.native import native as core
from llmserve.constraints.native import require_native

log = logging.getLogger(__name__)


class Finisher:
    """Completes lazily compiled constraints in the background and writes their cache files."""

    EXIT_WAIT_S = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # also keeps the buffers alive until the native side is done with them
        self._pending: dict[int, tuple[CompiledConstraint, Path, Completion]] = {}
        self._next_id = 0
        self.thread: threading.Thread | None = None

    def submit(self, compiled: CompiledConstraint, path: Path) -> None:
        with self._lock:
            self._next_id += 1
            job = self._next_id
            if self.thread is None or not self.thread.is_alive():  # first use, or a forked child
                self.thread = threading.Thread(target=self._run, name="llmserve-constraint-cache", daemon=True)
                self.thread.start()
            self._pending[job] = (compiled, path, compiled.completed_by(self.thread))
        compiled.native.finish_later(job)

    def _run(self) -> None:
        require_native()
        while True:
            job = core.finished_next()
            with self._lock:
                entry = self._pending.get(job)
            if entry is None:  # an id this process does not know: nothing to write
                continue
            compiled, path, completion = entry
            try:
                compiled.mark_complete()
                compiled.compress()
                try_write_cache(path, compiled)
            except Exception:
                log.exception("writing the cache of constraint %s failed", compiled.key)
            finally:
                completion.done.set()
                with self._lock:
                    del self._pending[job]

    def _forked(self) -> None:
        """In a forked child: the completions pending here were the parent's finisher thread's, which
        the child does not have (nor the core's queue of them: the child's is new, csrc/finisher.cpp),
        so none of them will be finished, nor their files written here. Nothing in the child waits for
        them (``Completion.pid``: a form completes its missing rows itself); their events are left
        alone, since a parent thread may have held one's lock at the fork. The lock is new likewise."""
        self._lock = threading.Lock()
        self._pending.clear()
        self.thread = None

    def wait_all(self, timeout: float) -> None:
        """At exit: let pending cache files be written rather than leave temporary ones behind."""
        deadline = time.monotonic() + timeout
        with self._lock:
            pending = [completion for _, _, completion in self._pending.values()]
        for completion in pending:
            completion.done.wait(max(0.0, deadline - time.monotonic()))


FINISHER = Finisher()
atexit.register(FINISHER.wait_all, Finisher.EXIT_WAIT_S)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=FINISHER._forked)
