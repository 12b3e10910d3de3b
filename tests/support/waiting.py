"""Polling for a state a controller reaches in its own time."""

from __future__ import annotations

import time


def wait_until(pred, timeout: float = 30.0, what: str = "", every: float = 0.2):
    """pred()'s first true value, polled every `every` seconds; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
