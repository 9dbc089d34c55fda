"""How an SSH host's connection is made and kept, whichever client makes it (OpenSSH or paramiko): one attempt
at a time in its own thread, transient failures retried with backoff within a budget, the rest raised at once."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from gpuops.errors import ConnectError, GpuopsError
from gpuops.targets import Host
from gpuops.transport.base import HostSide
from gpuops.transport.ssh.head_start import Early

if TYPE_CHECKING:
    from tenacity import RetryCallState

#: Each retried connect failure is said here (the CLI shows it on stderr): 30 s of silence reads as a hang.
LOG = logging.getLogger("gpuops.transport.connect")
LOG.addHandler(logging.NullHandler())
SAY_AFTER = 1.0  # seconds of retrying before a person is told


class _Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)  # a client's connection


class ConnectionLost(ConnectError):
    """The connection dropped while a command was running."""


class Connecting(HostSide, Generic[C]):
    """connect_soon / connect / reconnect / close for one host; a client fills in _connect_once, _transient,
    _active and _failure (its failure as a ConnectError, or None to re-raise it as it is)."""

    def __init__(self, host: Host, *, retry_time: float = 30.0) -> None:
        self.host = host
        self.label = host.name
        self.retry_time = retry_time
        self._conn: C | None = None
        self._early: Early[C] | None = None
        self._lock = threading.Lock()
        self.connections_made = 0
        self.commands = 0

    @property
    def command_timeout(self) -> float:
        return self.host.command_timeout

    # -- what a client provides ---------------------------------------------------------

    def _connect_once(self) -> C:
        raise NotImplementedError

    def _transient(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def _active(self) -> bool:
        raise NotImplementedError

    def _failure(self, exc: BaseException) -> GpuopsError | None:
        return None

    def _close_conn(self, conn: C) -> None:
        conn.close()

    # -- the lifecycle ------------------------------------------------------------------

    # Every attempt runs in its own thread (head_start.py) and callers wait for it without holding
    # the lock: Ctrl-C ends a wait at once, close() never waits for a handshake (a silent host held it
    # for its whole connect timeout), and threads asking for one host share one attempt.

    def connect_soon(self) -> None:
        with self._lock:
            if self._early is None and not self._active():
                self._start_locked()

    def connect(self) -> None:
        with self._lock:
            if self._early is None:
                if self._active():
                    return
                self._start_locked()
            early = self._early
        self._adopt(early)

    def reconnect(self) -> None:
        with self._lock:
            self._start_locked()
            early = self._early
        self._adopt(early)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _start_locked(self) -> None:
        """A new attempt in its thread; the connection there (or an attempt under way) is dropped first."""
        self._drop()
        self._early = Early(self._connect_with_retries, close=self._close_conn)

    def _adopt(self, early: Early[C] | None) -> None:
        """Wait for the attempt; its connection becomes this host's, its error is raised (once: the next
        connect() makes a new attempt)."""
        assert early is not None
        try:
            conn = early.result()
        except BaseException as exc:
            with self._lock:
                if self._early is early:
                    self._early = None
            if not isinstance(exc, Exception):  # Ctrl-C while it connects: its connection is closed when made
                early.discard()
            raise
        with self._lock:
            if self._early is early:
                self._early, self._conn = None, conn
            elif conn is None or self._conn is not conn:  # closed while it connected: nothing to adopt
                raise ConnectionLost(self.label, "the connection was closed while it was being made")

    def _drop(self) -> None:
        if self._early is not None:
            self._early.discard()
            self._early = None
        if self._conn is not None:
            try:
                self._close_conn(self._conn)
            except Exception:  # closing a dead connection may raise anything; it is gone either way
                pass
            self._conn = None

    def _connect_with_retries(self) -> C:
        started = time.monotonic()
        try:
            try:
                conn = self._connect_once()
            except Exception as exc:
                if not self._transient(exc) or self.retry_time <= 0:
                    raise
                # tenacity is imported here, on the first failure, not on every start-up (10-15 ms).
                conn = self._retry(self.retry_time - (time.monotonic() - started))
        except GpuopsError:
            raise
        except Exception as exc:
            failure = self._failure(exc)
            if failure is None:
                raise
            raise failure from None
        self.connections_made += self._made(conn)
        return conn

    def _made(self, conn: C) -> int:
        """How many new SSH logins this connection took (a reused master: none)."""
        return 1

    def _say_retry(self, exc: BaseException | None, attempts: int, started: float, ends: float) -> None:
        """Said once a second has gone by: a port refused at once reads as one error, not as a retry's chatter."""
        if time.monotonic() - started < SAY_AFTER:
            return
        why = getattr(exc, "why", None) or str(exc or "no answer").split("\n")[0]
        LOG.warning("%s: cannot connect yet (%s); trying again for up to %.0f s (%d attempts so far)", self.label,
                    why, max(0.0, ends - time.monotonic()), attempts)

    def _retry(self, budget: float) -> C:
        """The attempts after a first transient failure: exponential backoff with jitter
        (0.25 s, 0.5 s, 1 s ... at most 4 s), never sleeping past the budget left."""
        import random

        from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential, wait_random

        first_wait = max(0.0, min(0.25 + random.uniform(0, 0.25), budget))
        started = time.monotonic()
        ends = started + budget
        time.sleep(first_wait)
        budget -= first_wait
        backoff = wait_exponential(multiplier=0.5, max=4.0) + wait_random(0, 0.25)

        def wait(state: RetryCallState) -> float:
            # The last attempt starts when the budget ends.
            return max(0.0, min(backoff(state), budget - (state.seconds_since_start or 0.0)))

        def said(state: RetryCallState) -> None:
            self._say_retry(state.outcome.exception() if state.outcome else None, state.attempt_number + 1, started, ends)

        retrying = Retrying(stop=stop_after_delay(max(0.0, budget)), wait=wait, before_sleep=said,
                            retry=retry_if_exception(self._transient), reraise=True)
        return retrying(self._connect_once)
