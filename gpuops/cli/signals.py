"""SIGTERM and SIGHUP handled as Ctrl-C is: a cancelled CI job still gets its JUnit report, its summary and the
reattach hint.

Python's default for SIGTERM and SIGHUP is to die at once, mid-sentence. While a command runs, SIGTERM
raises `Terminated` and SIGHUP `HungUp` (a closed terminal, a dropped SSH session of the runner), both
KeyboardInterrupts: every path that handles Ctrl-C (the launch stopping its warmup, a follower saying
how to reattach, `launch --stop-on-exit` stopping its run, the JUnit report) handles them the same
way; the command exits with the signal's code, 128 + n, as a shell reports it (143, 129) instead of
130. A followed run stays alive, as with Ctrl-C, unless `--stop-on-exit`. A SIGHUP ignored from the
start (`nohup gpuops ...`) stays ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import TYPE_CHECKING, Iterator

from gpuops.errors import ExitCode

if TYPE_CHECKING:
    from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a command ran (a CI job cancelled): the command ends as after Ctrl-C, exit 143."""

    exit_code = ExitCode.TERMINATED
    word = "terminated"  # the JSON summary's outcome
    cause = "terminated (SIGTERM)"  # in a message


class HungUp(Terminated):
    """SIGHUP arrived while a command ran (its terminal or SSH session closed): as SIGTERM, exit 129."""

    exit_code = ExitCode.HANGUP
    word = "hangup"
    cause = "hung up (SIGHUP)"


def code_of(exc: BaseException) -> int:
    """The exit code of an interruption: 143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C."""
    return exc.exit_code if isinstance(exc, Terminated) else ExitCode.INTERRUPTED


def outcome_of(exc: BaseException) -> str:
    """The JSON summary's outcome for an interruption."""
    return exc.word if isinstance(exc, Terminated) else "interrupted"


def cause_of(exc: BaseException) -> str:
    """What interrupted, in words for a message."""
    return exc.cause if isinstance(exc, Terminated) else "interrupted"


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise HungUp() if signum == signal.SIGHUP else Terminated()


#: The signals that end a command as Ctrl-C does, each with its own exit code.
AS_INTERRUPT = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises Terminated and SIGHUP HungUp in the main thread (elsewhere signals
    cannot be set); a SIGHUP ignored from the start (nohup) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_terminated) for sig in AS_INTERRUPT
                if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """While the block runs (a stop that must finish), Ctrl-C, SIGTERM and SIGHUP are noted and do nothing:
    what they would ask for, the block is doing already."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT,) + AS_INTERRUPT
    previous = {sig: signal.signal(sig, lambda signum, frame: None) for sig in held
                if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
