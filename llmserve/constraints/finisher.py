"""Background completion of lazily compiled constraints, and their cache files.

One thread per process waits inside the native core (``finished_next``, without the GIL) and
compresses each queued constraint's rows there, alone (the pool stays free for batch fills), one row
at a time: rows requests computed are read, the others computed into a scratch row, so completing a
constraint holds what its compressed form holds, never its dense rows (a 60,000-state schema over a
128k vocabulary: 1 GB dense). It only takes the GIL once a constraint is compressed, to swap the
compressed rows in and write its file. Queueing is a native call, so it adds nothing to the compile
that queues: no thread to start, no GIL handoff. A constraint whose compressed rows pass
``complete_max_mb`` stays lazy (rows computed as requests reach them) and is not cached on disk.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from pathlib import Path

from llmserve.constraints.compiled import CompiledConstraint, Completion
from llmserve.constraints.disk_cache import try_write_cache
from llmserve.constraints.limits import limits
from llmserve.constraints.native import native as core
from llmserve.constraints.native import require_native

log = logging.getLogger(__name__)


def completed_max_bytes() -> int:
    """What a completed (compressed) form may hold: ``complete_max_mb`` (within the core's int64)."""
    return min(limits().complete_max_mb, 1 << 40) << 20


class Finisher:
    """Completes lazily compiled constraints in the background and writes their cache files."""

    EXIT_WAIT_S = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # also keeps the buffers alive until the native side is done with them
        self._pending: dict[int, tuple[CompiledConstraint, core.Grammar, Path, Completion]] = {}
        self._next_id = 0
        self.thread: threading.Thread | None = None
        # set while the thread is in _finish: until that call's frame is gone it may still drop the
        # last reference to a form's buffers (an mmap whose release lets go of the GIL)
        self._finishing = False
        # constraints (keys) whose compressed rows passed the cap here, and the cap they passed: not
        # tried again at that cap (a pass up to the cap is a core's work for seconds), most recent kept
        self._over: collections.OrderedDict[str, int] = collections.OrderedDict()

    OVER_KEPT = 4096
    RETRY_S = 1.0  # after finished_next itself failed

    def submit(self, compiled: CompiledConstraint, path: Path) -> None:
        cap = completed_max_bytes()
        with self._lock:
            if self._over.get(compiled.key, cap + 1) <= cap:
                return  # stays lazy, as it did the last time
            self._next_id += 1
            job = self._next_id
            if self.thread is None or not self.thread.is_alive():  # first use, or a forked child
                self.thread = threading.Thread(target=self._run, name="llmserve-constraint-cache", daemon=True)
                self.thread.start()
            grammar = compiled.native  # (the lazy one: the finished rows are its rows)
            completion = compiled.completed_by(self.thread)
            self._pending[job] = (compiled, grammar, path, completion)
        try:
            grammar.finish_later(job, cap)
        except Exception:
            # never a completion nobody will finish: complete() would wait for it forever
            log.exception("constraint %s: its background completion could not be queued", compiled.key[:12])
            with self._lock:
                self._pending.pop(job, None)
            completion.done.set()

    def _run(self) -> None:
        require_native()
        while True:
            try:
                job = core.finished_next()
            except Exception:
                # (out of memory) the thread goes on: every later completion would otherwise wait forever
                log.exception("the background completion of constraints failed; going on")
                time.sleep(self.RETRY_S)
                continue
            self._finishing = True
            try:
                self._finish(job)
            finally:
                self._finishing = False

    def _finish(self, job: int) -> None:
        """Job ``job``'s form compressed, swapped in and written. A call of its own: nothing of the form
        (the grammar the core made, a whole copy of the rows the form now holds shared, or the lazy
        form's rows) stays referenced from the loop while it waits for the next job."""
        with self._lock:
            entry = self._pending.get(job)
        if entry is None:  # an id this process does not know: nothing to write
            core.finished_take(job, None)
            return
        compiled, grammar, path, completion = entry
        try:
            done = self._take(job, compiled, grammar)
            if done is not None:
                compiled.adopt_compressed(done)
                try_write_cache(path, compiled)
        except Exception:
            log.exception("writing the cache of constraint %s failed", compiled.key)
        finally:
            completion.done.set()
            with self._lock:
                del self._pending[job]

    def _take(self, job: int, compiled: CompiledConstraint, grammar: core.Grammar) -> core.Grammar | None:
        """The compressed grammar the core made of job ``job``, or None where the form stays lazy
        (logged: it passed the cap, or the core failed to complete it)."""
        try:
            done = core.finished_take(job, grammar)
        except RuntimeError as exc:
            log.warning("constraint %s: %s; computing only the rows requests reach", compiled.key[:12], exc)
            return None
        if done is None:
            cap = completed_max_bytes()
            log.info(
                "constraint %s: its compressed rows pass complete_max_mb (%d MiB); computing only the rows "
                "requests reach, not caching it",
                compiled.key[:12],
                cap >> 20,
            )
            with self._lock:
                self._over[compiled.key] = cap
                self._over.move_to_end(compiled.key)
                while len(self._over) > self.OVER_KEPT:
                    self._over.popitem(last=False)
        return done

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
        """At exit: let pending cache files be written rather than leave temporary ones behind, and
        the thread get back to waiting inside the core. A daemon thread that needs the GIL once the
        interpreter is finalizing is ended by unwinding its stack, and unwinding through the core's
        destructors (a form's buffers released, which lets go of the GIL) aborts the process: an
        exit status of -6 (SIGABRT) for a server stopped cleanly."""
        deadline = time.monotonic() + timeout
        with self._lock:
            pending = [completion for *_, completion in self._pending.values()]
        for completion in pending:
            completion.done.wait(max(0.0, deadline - time.monotonic()))
        while (self._finishing or self._pending) and time.monotonic() < deadline:
            time.sleep(0.002)


FINISHER = Finisher()
atexit.register(FINISHER.wait_all, Finisher.EXIT_WAIT_S)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=FINISHER._forked)
