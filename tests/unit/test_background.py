"""The background thread that builds complete constraint forms (constraints/background.py): calls
run one at a time in order, a bounded number wait, and a closed worker starts nothing more."""

from __future__ import annotations

import threading

from llmserve.constraints.background import Background


def test_calls_run_in_order_and_past_the_bound_are_dropped():
    worker = Background("test-background", max_pending=2)
    started, gate = threading.Event(), threading.Event()
    ran: list[int] = []

    def running() -> None:
        started.set()
        gate.wait()

    assert worker.submit(running)
    assert started.wait(10)  # running, no longer waiting
    assert worker.submit(lambda: ran.append(1))
    assert worker.submit(lambda: ran.append(2))
    assert worker.submit(lambda: ran.append(3)) is False  # two wait already
    gate.set()
    assert worker.drain(10)  # a drain is never dropped
    assert ran == [1, 2]


def test_a_failing_call_does_not_stop_the_ones_after_it():
    worker = Background("test-background")
    ran: list[int] = []
    worker.submit(lambda: 1 / 0)
    worker.submit(lambda: ran.append(1))
    assert worker.drain(10)
    assert ran == [1]


def test_a_closed_worker_waits_for_its_running_call_and_starts_no_other():
    worker = Background("test-background")
    started, gate = threading.Event(), threading.Event()
    ran: list[int] = []

    def running() -> None:
        started.set()
        gate.wait()
        ran.append(0)

    worker.submit(running)
    worker.submit(lambda: ran.append(1))
    assert started.wait(10)
    threading.Timer(0.2, gate.set).start()
    worker.close(10)
    assert ran == [0]  # the running call finished before close returned; the queued one never starts
    assert worker.submit(lambda: ran.append(2)) is False
