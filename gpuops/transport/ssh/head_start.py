"""A call started before its answer is needed, so the command's own start-up overlaps its waits.

`gpuops status` knows its hosts once the inventory is read, but still has modules to import and a
probe to build before it sends anything. Started then, the waits of reaching a host (`ssh -G`, then
the TCP and SSH handshakes, which are the server's work) are spent on that start-up instead of after
it. The call is the one that would have run anyway (a connect with its retries, or a resolution);
its answer, or the error it raised, is what its first user gets, as if that user had made the call.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Early(Generic[T]):
    """One call running in a daemon thread (the command may end before it does)."""

    def __init__(self, call: Callable[[], T], *, close: Callable[[T], None] | None = None) -> None:
        self._call = call
        self._close = close  # how to let go of an answer nobody will use (a connection: closed)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._discarded = False
        threading.Thread(target=self._run, name="gpuops-early", daemon=True).start()

    def _run(self) -> None:
        try:
            value = self._call()
        except BaseException as exc:  # raised again where the answer is asked for
            self._error = exc
        else:
            with self._lock:
                if self._discarded:  # given up on meanwhile: nobody will use it
                    self._let_go(value)
                else:
                    self._value = value
        self._done.set()

    def result(self) -> T | None:
        """The answer, once the call ends (its error raised here; None once discarded); Ctrl-C interrupts the wait."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def discard(self) -> None:
        """Nobody will use the answer: let go of it now if it came, else as soon as it comes."""
        with self._lock:
            self._discarded = True
            value, self._value = self._value, None
        self._let_go(value)

    def _let_go(self, value: T | None) -> None:
        if value is not None and self._close is not None:
            self._close(value)
