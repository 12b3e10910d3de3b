"""A process forked while the constraint core was busy in another thread (a mask row being computed,
a background completion) has only the forking thread: what that other thread left mid-way must not
make the child wait for it forever. Each case runs in its own subprocess with a deadline; a child
that hangs is killed by its alarm and shows as exit -14. (The thread pool's case is in
test_pool_dispatch.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SETUP = """
import os, signal, tempfile, threading, time
import numpy as np
from llmserve.constraints.compiled import CompiledConstraint
from llmserve.constraints.compiler import compile_constraint
from llmserve.constraints.regex import compile_ast, parse
from llmserve.constraints.vocab import Vocab

rng = np.random.default_rng(1)
letters = np.frombuffer(b"abcdefghij0123456789", dtype=np.uint8)
V = 30000
tokens = [bytes([b]) for b in range(256)]
while len(tokens) < V - 1:
    tokens.append(bytes(rng.choice(letters, int(rng.integers(2, 7)))))
tokens.append(None)  # end of sequence
vocab = Vocab(tokens, (V - 1,), V)
PATTERN = "[a-j]{0,1000}[0-9]{0,1000}[k-t]{0,%d}x"

def in_child(work):
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        try:
            work()
        except BaseException:
            os._exit(3)
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
"""


def run(body: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SETUP + textwrap.dedent(body)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_row_the_parent_was_computing_is_computed_by_the_child():
    run(
        """
        dfa = compile_ast(parse(PATTERN % 1000), classes=True)
        want = CompiledConstraint.lazy(vocab, dfa)
        want.native.complete(1)
        codes = []
        for trial in range(6):
            c = CompiledConstraint.lazy(vocab, dfa)
            t = threading.Thread(target=c.native.complete, args=(1,))  # the finisher's call
            t.start()
            time.sleep(0.002 * (trial + 1))

            def check():
                c.native.complete(1)  # every row, as a fill reaching them would
                assert all(np.array_equal(c.mask_row(s), want.mask_row(s)) for s in range(0, c.num_states, 97))

            codes.append(in_child(check))
            t.join()
        assert codes == [0] * 6, codes
        """
    )


def test_a_completion_the_parent_had_queued_does_not_hold_the_child():
    run(
        """
        codes = []
        for i in range(4):
            c = compile_constraint({"regex": PATTERN % (900 + i)}, vocab, cache_dir=tempfile.mkdtemp())
            time.sleep(0.005)  # the background finisher is completing it now
            codes.append(in_child(lambda: c.complete()))
            c.complete()
        assert codes == [0] * 4, codes
        """
    )


def test_a_child_writes_its_own_copy_of_a_lazy_forms_rows():
    """The lazy mask buffer is a private mapping: rows a child writes (it computes those the parent
    had not) never land in the parent's pages, where the parent would serve them and write them to
    its cache file. (An anonymous mmap is shared by default.)"""
    run(
        """
        dfa = compile_ast(parse(PATTERN % 300), classes=True)
        c = CompiledConstraint.lazy(vocab, dfa)
        c.native.complete(1)  # every row, still in the lazy buffer (not compressed)
        rows = c._masks
        before = rows.copy()

        def scribble():
            rows[:] = 0xFFFFFFFF  # whatever the child writes

        assert in_child(scribble) == 0
        assert np.array_equal(rows, before)
        """
    )


def test_a_fork_while_a_parent_thread_waits_on_a_completion_does_not_hold_the_child():
    """The finisher's after-fork hook leaves the parent's completion events alone: a parent thread
    may hold one's lock at the fork (waiting for a form to complete), which the child would then wait
    for forever."""
    run(
        """
        from llmserve.constraints.compiled import Completion
        from llmserve.constraints.finisher import FINISHER

        pending = Completion(threading.current_thread())
        FINISHER._pending[10**9] = (None, None, None, pending)  # as the finisher's own thread would hold it
        stop = threading.Event()

        def waiter():
            while not stop.is_set():
                pending.done.wait(0)

        t = threading.Thread(target=waiter)
        t.start()
        codes = [in_child(lambda: None) for _ in range(20)]
        stop.set()
        t.join()
        del FINISHER._pending[10**9]
        assert codes == [0] * 20, codes
        """
    )


def test_a_lazy_form_the_parent_was_walking_is_rebuilt_by_the_child():
    """A child forked while another thread held a lazy form's automaton (computing a row) serves the
    same constraint from an automaton of its own, with the same masks, and its background builder
    completes the whole form there."""
    run(
        """
        from llmserve.constraints import compiler
        from llmserve.constraints.lazy_form import LazyConstraint
        from llmserve.constraints.native import native, native_vocab

        obj = {"regex": PATTERN % 1000}
        compiler._BUILDER.submit(threading.Event().wait)  # the parent's builder stays busy
        form = compiler.serving_form(obj, vocab, cache_dir=False)
        assert isinstance(form, LazyConstraint)
        want = np.zeros(vocab.words, np.uint32)
        form.lazy.mask_row(native_vocab(vocab), 0, want)
        codes = []
        for trial in range(4):
            t = threading.Thread(target=lambda: [form.lazy.walk(b"a" * n) for n in range(1, 400)])
            t.start()
            time.sleep(0.001 * (trial + 1))

            def check():
                mine = compiler.serving_form(obj, vocab, cache_dir=False)
                assert isinstance(mine, LazyConstraint) and mine is not form and mine.lazy is not form.lazy
                got = np.zeros(vocab.words, np.uint32)
                mine.lazy.mask_row(native_vocab(vocab), 0, got)
                assert np.array_equal(got, want)
                assert compiler._BUILDER.drain(30)
                assert not isinstance(compiler.serving_form(obj, vocab, cache_dir=False), LazyConstraint)

            codes.append(in_child(check))
            t.join()
        assert codes == [0] * 4, codes
        """
    )


def test_a_process_exits_cleanly_right_after_queueing_completions():
    """At exit the finisher's thread is let back into the core before the interpreter finalizes: a
    daemon thread that needs the GIL then is ended by unwinding its stack, and unwinding through the
    core's destructors (a form's buffers released) aborted the process (SIGABRT, exit -6) about
    half the time here, a server stopped cleanly among them."""
    for _ in range(5):
        run(
            """
            for i in range(4):
                compile_constraint({"regex": PATTERN % (900 + i)}, vocab, cache_dir=tempfile.mkdtemp())
            time.sleep(0.005)
            """
        )
