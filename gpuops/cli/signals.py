"""SIGTERM handled as Ctrl-C is: a cancelled CI job still gets its JUnit report, its summary and the reattach hint.

Python's default for SIGTERM is to die at once, mid-sentence. While a command runs, SIGTERM raises
`Terminated`, a KeyboardInterrupt: every path that handles Ctrl-C (the launch stopping its warmup, a
follower saying how to reattach, the JUnit report) handles it the same way; the command exits 143
(128 + 15, what a shell reports for SIGTERM) instead of 130. A followed run stays alive, as with Ctrl-C.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

from gpuops.errors import ExitCode


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a command ran (a CI job cancelled): the command ends as after Ctrl-C, exit 143."""

    exit_code = ExitCode.TERMINATED


def code_of(exc: BaseException) -> int:
    """The exit code of an interruption: 143 for SIGTERM, 130 for Ctrl-C."""
    return ExitCode.TERMINATED if isinstance(exc, Terminated) else ExitCode.INTERRUPTED


def outcome_of(exc: BaseException) -> str:
    """The JSON summary's outcome for an interruption."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"


def cause_of(exc: BaseException) -> str:
    """What interrupted, in words for a message."""
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises Terminated in the main thread (elsewhere signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
