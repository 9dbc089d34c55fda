"""The watchdog's periodic duties: each one object with its interval, run by the watchdog's loop when due.

As SkyPilot's skylet runs its events (sky/skylet/events.py: each a class with EVENT_INTERVAL_SECONDS),
the watchdog's loop makes one pass per wake (the log grew, a record changed, a sample came, or the
heartbeat is due) and offers the pass to each duty in DUTIES' order; a duty runs when it is due. No
duty sleeps or waits: the loop's one wait ends at the heartbeat's next beat (`Heartbeat.next_at`).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Tuple, Type, TypeVar

from ..detect import hardware
from ..run import restart as restarts
from ..run.abort import claimer_dead, finish_orphan
from ..wire import protocol as p
from ..wire.records import read_json, write_state
from .logfile import last_line

if TYPE_CHECKING:
    import threading

    from ..detect.quiet_failures import Quiet as QuietFailures
    from ..run.liveness import Liveness
    from ..system.wake import Waker
    from ..wire.masking import Masker
    from ..wire.signatures.matcher import Matcher
    from ..wire.stall import StallClock
    from ..wire.watchfile import WatchConfig
    from .heartbeat import EventLog, Pulse

D = TypeVar("D", bound="Duty")

#: While the log streams, the records are looked at this often (at the log's end: when a wake says so).
CLAIMS_EVERY = 0.25


class Watched(Protocol):
    """What the duties see of the watchdog (watchdog.Watchdog): its run, clocks and records, and what it does."""

    d: str
    cfg: WatchConfig
    status: str  # watching | aborting | ...
    started: float
    offset: int
    safe: Tuple[int, int]
    inode: int
    session_seen: bool
    restarts: int
    attempt: Dict[str, Any]
    over: bool
    write_failing: bool
    state_path: str
    retry_abort: Optional[Tuple[str, Dict[str, Any]]]
    aborter: Optional[threading.Thread]
    masker: Masker
    matcher: Matcher
    stall: StallClock
    quiet: QuietFailures
    events: EventLog
    pulse: Pulse
    waker: Waker
    live: Liveness

    def abort(self, reason: str, **why: Any) -> None: ...

    def start_aborter(self, sequence: Callable[[], Any], name: Optional[str] = None) -> None: ...

    def seen_claim(self, record: Dict[str, Any]) -> None: ...

    def on_finding(self, f: Any) -> None: ...

    def note_write_error(self, exc: OSError) -> None: ...

    def duty(self, kind: Type[D]) -> D: ...


class Pass:
    """One pass of the loop: its clocks, whether the read reached the log's end, what woke the wait."""

    __slots__ = ("wd", "now", "mono", "at_end", "ready", "_look")

    def __init__(self, wd: Watched, now: float, mono: float, at_end: bool, ready: bool) -> None:
        self.wd, self.now, self.mono, self.at_end, self.ready = wd, now, mono, at_end, ready
        self._look: Optional[bool] = None

    @property
    def look(self) -> bool:
        """Whether the run's records may have changed: the wait said so (or it polls, or a pipe woke it), the
        pane needs tmux, or an abort is under way. A wake for a log line alone costs no look. Decided once a
        pass, when first asked (by Claims, after the stall and quiet duties ran)."""
        if self._look is None:
            wd = self.wd
            self._look = wd.waker.records or self.ready or wd.live.pid is None or wd.status != "watching"
        return self._look


class Duty:
    """One periodic duty: `run` when `due`; `interval` seconds from one run to the next (0: every pass)."""

    interval = 0.0

    def __init__(self, wd: Watched) -> None:
        self.wd = wd
        self.next_at = 0.0

    def due(self, w: Pass) -> bool:
        return w.now >= self.next_at

    def __call__(self, w: Pass) -> None:
        if self.due(w):
            self.next_at = w.now + self.interval
            self.run(w)

    def run(self, w: Pass) -> None:
        raise NotImplementedError


class Stall(Duty):
    """The stall clock, every pass: silent too long, the run is stopped (said once per silence)."""

    def __init__(self, wd: Watched) -> None:
        super().__init__(wd)
        self.said = False

    def run(self, w: Pass) -> None:
        wd = self.wd
        if wd.status != "watching" or not wd.stall.stalled(w.mono):
            return
        seconds = round(wd.stall.silent_for(w.mono), 1)
        limit = wd.stall.timeout_now(w.mono)
        missing = {} if os.path.exists(os.path.join(wd.d, p.LOG)) else {"log_missing": True}
        if not self.said:
            self.said = True
            wd.events.write("stall", seconds=seconds, stall_timeout=limit, stall=wd.stall.describe(), **missing)
            try:
                hardware.explain(wd, "stall", wait=False)  # an Xid on a run GPU in its window: reported as the Xid
            except OSError as exc:
                wd.note_write_error(exc)
        wd.abort("stall", seconds=seconds, stall_timeout=limit, last_line=last_line(wd.d, wd.masker), **missing)


class Quiet(Duty):
    """GPU samples, figures and the cache, judged (detect/quiet_failures.py): once a heartbeat period, or when
    a sample woke the wait. A finding is a match of its detector's rule."""

    interval = p.HEARTBEAT_EVERY

    def due(self, w: Pass) -> bool:
        """Also when the host's kernel-log follower handed an Xid over (host-xids.jsonl grew: a record change)."""
        return w.ready or super().due(w) or (self.wd.waker.records and self.wd.quiet.host_grew())

    def run(self, w: Pass) -> None:
        wd = self.wd
        try:
            findings = wd.quiet.tick(w.now)
        except OSError as exc:  # samples that cannot be written (a full disk): the next tick tries again
            wd.note_write_error(exc)
            return
        for finding in findings:
            wd.on_finding(finding)
        problem = wd.quiet.problem()
        if problem:
            wd.events.write("telemetry_problem", message=problem)


class Claims(Duty):
    """An abort someone else claimed (abort.json): said once; one whose claimer died is finished here. At the
    log's end when the records may have changed; while the log streams, every CLAIMS_EVERY seconds."""

    interval = CLAIMS_EVERY

    def due(self, w: Pass) -> bool:
        look = w.look
        return look if w.at_end else super().due(w)

    def run(self, w: Pass) -> None:
        """An abort claimed by someone whose process is gone before it finished (or whose abort.json is
        unreadable): finish it (kill, reap, drain; no second signal)."""
        wd = self.wd
        path = os.path.join(wd.d, p.ABORT)
        if not os.path.exists(path):
            return
        record = read_json(path) or {}
        if wd.status == "watching":
            wd.seen_claim(record)
        if wd.aborter is not None or not claimer_dead(wd.d):
            return
        by = record.get("by") or "?"
        wd.events.write("abort_completed", stopped_by=by,
                        message="a Ctrl-C typed in the run's tmux pane ended it; the watchdog reaps what is left"
                        if by == "pane" else "the process that claimed the abort is gone; the watchdog finishes it")
        wd.start_aborter(lambda: finish_orphan(wd.d, wd.cfg))


class Heartbeat(Duty):
    """watchdog.json (the heartbeat and resume point) and the pulse to the supervisor, every HEARTBEAT_EVERY
    seconds by its own clock (it runs last in a pass); also an abort that could not be claimed, tried again."""

    interval = p.HEARTBEAT_EVERY
    last: Optional[Dict[str, Any]] = None  # the record of the last beat (the metrics read it)

    def __call__(self, w: Pass) -> None:
        self.beat()

    def beat(self, force: bool = False) -> None:
        now = time.time()
        if not force and now < self.next_at:
            return
        self.next_at = now + self.interval
        wd = self.wd
        wd.pulse.beat()
        wd.events.flush()
        if wd.retry_abort is not None and wd.status == "watching":
            wd.abort(wd.retry_abort[0], **wd.retry_abort[1])
        self.last = self.record(now)
        failed = write_state(wd.state_path, self.last)
        if failed is not None:
            wd.note_write_error(failed)
        elif wd.write_failing and not wd.events.pending:
            wd.write_failing = False

    def record(self, now: float) -> Any:
        wd = self.wd
        return {
            "pid": os.getpid(), "ts": round(now, 3), "started": wd.started, "state": wd.status,
            "offset": wd.offset, "line": wd.matcher.line_number, "safe_offset": wd.safe[0], "safe_line": wd.safe[1],
            "inode": wd.inode, "stall": wd.stall.describe(), "session_seen": wd.session_seen,
            "restarts": wd.restarts, "attempt": wd.attempt["attempt"], "start_failed": wd.attempt.get("start_failed"),
            "max_attempts": wd.cfg.max_attempts,
            "restart_due": (wd.status == "aborting" or wd.over) and restarts.due(wd.d, wd.cfg) is not None,
            "disabled_rules": sorted(wd.matcher.guard.disabled), "wait": wd.waker.mode,
            **wd.quiet.heartbeat(),
        }


class Metrics(Duty):
    """The run's series for Prometheus (playbook `watch.metrics`), every sample interval after the heartbeat:
    rendered here, written and pushed by threads of their own (agent/metrics), so a metrics place that is
    unwritable, full or slow never delays a pass; its failure is said once per spell (`metrics_failed`)."""

    def __init__(self, wd: Watched) -> None:
        super().__init__(wd)
        self.interval = wd.cfg.sample_interval
        self.publisher: Any = None
        if wd.cfg.metrics.on:
            from ..metrics.publish import Publisher  # only where the playbook asks for metrics

            self.publisher = Publisher(wd.d, wd.cfg, wd.masker)

    def due(self, w: Pass) -> bool:
        return self.publisher is not None and super().due(w)

    def wake_at(self) -> float:
        """When the loop's wait must end for the next render (never, without metrics)."""
        return self.next_at if self.publisher is not None else float("inf")

    def run(self, w: Pass) -> None:
        # the watchdog's state this moment (as the heartbeat would record it): a render is never a beat behind
        self.say(self.publisher.publish(w.now, self.wd.duty(Heartbeat).record(w.now)))

    def now(self) -> None:
        """Out of turn: the attempt ended and the next one waits (the run shows as restarting, as watchdog.json
        says it: the next attempt's number, no samples)."""
        if self.publisher is not None:
            self.say(self.publisher.publish(time.time(), None))

    def end(self) -> None:
        """The run ended (its final heartbeat written): its final state, and its series' expiry."""
        if self.publisher is not None:
            self.say(self.publisher.end(time.time(), self.wd.duty(Heartbeat).last))

    def say(self, warnings: List[str]) -> None:
        for message in warnings:
            self.wd.events.write("metrics_failed", message=message + "; the run is watched as before")


#: The duties, in the order a pass offers itself to them (the heartbeat records what the others did; the
#: metrics show what it recorded).
DUTIES = (Stall, Quiet, Claims, Heartbeat, Metrics)
