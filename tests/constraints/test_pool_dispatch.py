"""How the native core spreads a batch fill/apply over its thread pool (issue #17 item 4).

Waking the pool costs more than streaming one row of a 128k-token vocabulary, so small batches
must run inline on the calling thread: these tests read the core's dispatch counter
(``pool_dispatches``), never a timing. They also pin that the inline and pooled paths write
exactly the same logits and bitmasks.

Each check runs in a subprocess with ``LLMSERVE_CONSTRAINT_THREADS=4``: the pool is created once per
process at its first use, and four threads make it a real pool whatever the machine's core count.

After a job a worker spins for ``spin_us`` before it sleeps, so that the next call (the next fill or
apply of a step, back-to-back benchmark calls) finds it running instead of paying a wake-up that
comes after a job of tens of microseconds is done. The spinning tests read the wake-up and
spin-join counters and the spinning/sleeping gauges: a state is waited for (polled, with a generous
deadline), never timed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SETUP = """
import numpy as np
from llmserve.constraints import _core as core
from llmserve.constraints.compiled import compile_dfa
from llmserve.constraints.native import native_vocab
from llmserve.constraints.regex import compile_regex
from llmserve.constraints.vocab import Vocab

assert core.pool_size() == 4, core.pool_size()
V = 128_256  # Llama-3's vocabulary width: one row of logits is 513 KB
rng = np.random.default_rng(17)
letters = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz.,!0123456789", dtype=np.uint8)
tokens = [bytes([b]) for b in range(256)]
while len(tokens) < V - 1:
    tokens.append(bytes(rng.choice(letters, int(rng.integers(2, 7)))))
tokens.append(None)  # end of sequence
vocab = Vocab(tokens, (V - 1,), V)
nv = native_vocab(vocab)
grammar = compile_dfa(compile_regex(r"[a-z ]{1,40}[.!]"), vocab)
sample = list(b"hello world and more words.")
import time

def wait_for(cond, what, deadline=120.0):
    end = time.monotonic() + deadline
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.001)

def batch_of(B, rows):
    b = core.Batch(nv)
    for r in range(B):
        k = rows[r]
        b.set_row(r, None if k < 0 else grammar.native, [int(t) for t in sample[:k]] if k >= 0 else [])
    b.sync(B)
    return b
"""


def run(body: str) -> None:
    env = {**os.environ, "LLMSERVE_CONSTRAINT_THREADS": "4"}
    script = SETUP + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_small_batches_run_inline_and_large_ones_on_the_pool():
    run(
        """
        assert core.min_bytes_per_thread() == 2 << 20
        for B in (1, 8):
            b = batch_of(B, [r % len(sample) for r in range(B)])
            logits = rng.standard_normal((B, V)).astype(np.float32)
            out = np.zeros((B, (V + 31) // 32), np.uint32)
            before = core.pool_dispatches()
            if B == 1:  # one row of logits, read and written once: 1 MB, under a thread's share
                b.fill_apply(logits)
                b.fill_apply(logits, out)
                core.apply_bitmask(logits, out)
                wide = np.zeros((1, 262_144), np.float32)  # Gemma's width: 2 MiB, still one thread
                core.apply_bitmask(wide, np.full((1, 262_144 // 32), 0xFFFFFFFF, np.uint32))
            b.fill(out)  # B rows of 16 KB
            assert core.pool_dispatches() == before, (B, core.pool_dispatches() - before)

        B = 256
        b = batch_of(B, [r % len(sample) for r in range(B)])
        logits = rng.standard_normal((B, V)).astype(np.float32)
        out = np.zeros((B, (V + 31) // 32), np.uint32)
        for call in (lambda: b.fill_apply(logits), lambda: b.fill(out), lambda: core.apply_bitmask(logits, out)):
            before = core.pool_dispatches()
            call()
            assert core.pool_dispatches() == before + 1
        before = core.pool_dispatches()
        b.fill_apply(logits, nthreads=1)  # an explicit single thread stays inline at any size
        assert core.pool_dispatches() == before
        """
    )


def test_threshold_is_settable_and_restorable():
    run(
        """
        b = batch_of(1, [3])
        logits = rng.standard_normal((1, V)).astype(np.float32)
        assert core.set_min_bytes_per_thread(1) == 2 << 20
        before = core.pool_dispatches()
        b.fill_apply(logits)  # every byte worth a thread: even one row goes to the pool
        assert core.pool_dispatches() == before + 1
        assert core.set_min_bytes_per_thread(0) == 1  # 0: back to the default
        assert core.min_bytes_per_thread() == 2 << 20
        """
    )


def test_inline_and_pooled_paths_write_the_same_logits_and_bitmask():
    """Random batches (unconstrained rows, dead rows, strided logits, logits wider than the
    vocabulary, bitmasks wider than the logits): the pool forced on (a thread's share of one byte)
    against one thread."""
    run(
        """
        for trial in range(12):
            B = int(rng.integers(1, 24))
            rows = [int(rng.integers(-1, len(sample) + 1)) for _ in range(B)]
            b = batch_of(B, rows)
            if trial % 3 == 0:  # a row that left the language: its state is dead
                b.set_row(0, grammar.native, [ord("A")])
                b.sync(B)
            width = V + int(rng.integers(0, 70))
            pad = int(rng.integers(0, 3)) * 32
            base = rng.standard_normal((B, width + pad)).astype(np.float32)
            W = (width + 31) // 32 + int(rng.integers(0, 3))
            results = []
            for forced in (False, True):
                core.set_min_bytes_per_thread(1 if forced else 0)
                nth = 0 if forced else 1
                before = core.pool_dispatches()
                l1 = base.copy()[:, :width]  # strided when pad > 0
                o1 = np.full((B, W), 7, np.uint32)
                b.fill_apply(l1, o1, nthreads=nth)
                l2 = base.copy()[:, :width]
                b.fill_apply(l2, nthreads=nth)
                o2 = np.full((B, W), 7, np.uint32)
                a2 = np.zeros(B, np.uint8)
                b.fill(o2, a2, B, nthreads=nth)
                l3 = np.ascontiguousarray(base[:, :width])
                core.apply_bitmask(l3, o2, a2, nthreads=nth)
                dispatched = core.pool_dispatches() - before
                # fill_apply twice and apply_bitmask split every row in 4 chunks (a fill of B <= 2
                # rows is one task, hence inline)
                assert dispatched >= 3 if forced else dispatched == 0, (forced, dispatched)
                results.append((l1, o1, l2, o2, a2, l3))
            for x, y in zip(*results):
                np.testing.assert_array_equal(x, y)
        core.set_min_bytes_per_thread(0)
        """
    )


def test_a_spinning_worker_takes_the_next_job_without_a_wake_up():
    """Back-to-back pooled calls: the worker that finished the last one is still spinning, the
    next call publishes its job without waking anyone, and the spinning worker joins it."""
    run(
        """
        import os
        if (os.cpu_count() or 1) < 2:
            print("one CPU: no worker spins (the caller needs it)")
            raise SystemExit(0)
        B = 32  # ~0.1-0.2 ms a call: time for the spinning worker to see it even when it shares a CPU
        b = batch_of(B, [r % len(sample) for r in range(B)])
        logits = rng.standard_normal((B, V)).astype(np.float32)
        core.set_min_bytes_per_thread(1)  # every call to the pool
        assert core.set_spin_us(600_000_000) == 200  # ten minutes: the worker is still spinning below
        # and it keeps spinning even if this machine is busy enough to take its CPU away for a while
        assert core.set_spin_backoff_us(0) == 50_000
        b.fill_apply(logits, nthreads=2)  # wakes a worker, which then spins
        wait_for(lambda: core.pool_spinning() >= 1, "no worker spinning after a pooled call")
        dispatches, wakeups, joins = core.pool_dispatches(), core.pool_wakeups(), core.pool_spin_joins()
        calls, end = 0, time.monotonic() + 240  # a loaded machine may keep the worker off its CPU
        while core.pool_spin_joins() == joins and time.monotonic() < end:
            b.fill_apply(logits, nthreads=2)  # one worker wanted: the spinning one
            calls += 1
        assert core.pool_spin_joins() > joins, ("a spinning worker never joined", calls)
        assert core.pool_dispatches() == dispatches + calls
        assert core.pool_wakeups() == wakeups, (calls, core.pool_wakeups() - wakeups)
        core.set_spin_us(-1)
        assert core.spin_us() == 200
        core.set_spin_backoff_us(-1)
        assert core.spin_backoff_us() == 50_000
        """
    )


def test_idle_workers_stop_spinning_and_sleep():
    """Spinning is bounded: after spin_us with no call every worker sleeps (an idle pool burns no
    CPU), and the next call wakes one; with spinning off a worker goes straight back to sleep."""
    run(
        """
        B = 8
        b = batch_of(B, [r % len(sample) for r in range(B)])
        logits = rng.standard_normal((B, V)).astype(np.float32)
        core.set_min_bytes_per_thread(1)
        core.set_spin_us(2000)
        for _ in range(5):
            b.fill_apply(logits)
        wait_for(lambda: core.pool_spinning() == 0 and core.pool_sleeping() == 3, "workers still awake")
        before = core.pool_wakeups()
        b.fill_apply(logits)
        assert core.pool_wakeups() == before + 1  # they were all asleep: the call woke them

        core.set_spin_us(0)
        wait_for(lambda: core.pool_sleeping() == 3, "workers still awake")
        joins = core.pool_spin_joins()
        for _ in range(20):
            before = core.pool_wakeups()
            b.fill_apply(logits)
            wait_for(lambda: core.pool_sleeping() == 3, "a worker did not go back to sleep")
            assert core.pool_wakeups() == before + 1
        assert core.pool_spin_joins() == joins
        """
    )


def test_spinning_pool_under_concurrent_callers_and_exit():
    """Two Python threads calling the pool at once (calls serialise), spinning workers, then the
    process exits while workers spin: every result right, no hang (the subprocess has a deadline)."""
    run(
        """
        import threading
        core.set_min_bytes_per_thread(1)
        core.set_spin_us(1_000_000)
        B = 8
        b1 = batch_of(B, [r % len(sample) for r in range(B)])
        b2 = batch_of(B, [(r + 3) % len(sample) for r in range(B)])
        base = rng.standard_normal((B, V)).astype(np.float32)
        want1, want2 = base.copy(), base.copy()
        b1.fill_apply(want1, nthreads=1)
        b2.fill_apply(want2, nthreads=1)
        errors = []

        def work(b, want):
            try:
                for _ in range(100):
                    got = base.copy()
                    b.fill_apply(got)
                    np.testing.assert_array_equal(got, want)
            except Exception as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=a) for a in ((b1, want1), (b2, want2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        b1.fill_apply(base.copy())  # the workers spin while the process exits
        """
    )


def test_a_child_forked_mid_call_gets_a_pool_of_its_own():
    """A process forked while another thread is inside a pooled call inherits the pool mid-call:
    its workers do not exist in the child, whose first pooled call would wait for them forever. The
    child gets a new pool: each child's pooled call completes, with the same logits as inline."""
    run(
        """
        import os, threading
        core.set_min_bytes_per_thread(1)
        B = 8
        b = batch_of(B, [r % len(sample) for r in range(B)])
        base = rng.standard_normal((B, V)).astype(np.float32)
        want = base.copy()
        b.fill_apply(want, nthreads=1)
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                b.fill_apply(base.copy())

        t = threading.Thread(target=busy)
        t.start()
        time.sleep(0.1)
        kids = []
        for _ in range(10):
            pid = os.fork()
            if pid == 0:
                got = base.copy()
                b.fill_apply(got)
                os._exit(0 if np.array_equal(got, want) and core.pool_size() == 4 else 3)
            kids.append(pid)
            time.sleep(0.005)
        stop.set()
        t.join()
        end, codes = time.monotonic() + 60, []
        for pid in kids:
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
                if time.monotonic() > end:
                    os.kill(pid, 9)
                    done = os.waitpid(pid, 0)
                    break
                time.sleep(0.01)
            codes.append(os.waitstatus_to_exitcode(done[1]))
        assert codes == [0] * len(kids), codes  # -9: hung in its pooled call
        """
    )
