"""Deadline-based waiting: tests wait for conditions, never for fixed sleeps."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

# A loaded 2-core CI machine can stall a process for seconds; deadlines are generous.
DEFAULT_TIMEOUT = 15.0


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline (an AssertionError, so pytest shows it as a failure)."""


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll `predicate` until it returns a truthy value and return that value; raise WaitTimeout at the deadline."""
    deadline = time.monotonic() + timeout
    delay = interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {text}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
