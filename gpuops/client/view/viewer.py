"""View a run: stream its log, show what its watchdog decides, and stand in for the watchdog only when it
is gone (no heartbeat for HEARTBEAT_STALE seconds).

The watchdog on the target is the run's guard; a client is a viewer. It keeps a shadow matcher
over the same bytes so that, if the watchdog stops answering, it takes over at once: it reports
and acts on the matches the watchdog has not reached, and runs the stall clock. Every stop goes
through the target's one abort sequence, so whoever stops the run, it is stopped once.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from gpuops.agent.wire.marks import AbortReply
from gpuops.agent.wire.protocol import HEARTBEAT_STALE, SCHEMA_VERSION, WATCHDOG_NOTES
from gpuops.agent.wire.protocol import WATCHDOG_RESTARTING as RESTARTING
from gpuops.agent.wire.stall import StallClock
from gpuops.client.events import Event, Outcome
from gpuops.client.outcome import ended_outcome, last_line
from gpuops.client.play import Play
from gpuops.client.stop_call import abort_run
from gpuops.client.view.follower import (
    Data,
    Ended,
    Heartbeat,
    LogFollower,
    Reconnected,
    Reconnecting,
    Reset,
    WatchdogEvent,
)
from gpuops.errors import ContainerNotRunning, ExitCode

#: Watchdog events shown as they are (a match, an abort ...); the rest are `watchdog` events.
_SHOWN = ("match", "abort_start", "aborted", "stall", "rule_disabled", "stopped_elsewhere", "survivors", "log_reset",
          "restart", "notify_sent", "notify_failed")
_KNOWN = frozenset(_SHOWN + WATCHDOG_NOTES)
#: A record's fields that are its envelope, not its data (the event carries its own).
_ENVELOPE = ("event", "ts", "schema_version", "target", "run")


def build_matcher(play: Play, start_offset: int = 0) -> Any:
    """The rules the run was launched with (watch.json's content), hyperscan's literal search if installed."""
    from gpuops.agent.wire.ruleset import build_matcher as build
    from gpuops.client.runspec import watch_config
    from gpuops.client.view import accel

    prefilter = accel.hyperscan_prefilter if accel.available() else None
    return build(watch_config(play, "0"), start_offset, 1, play.mask, prefilter)


def _hit_data(hit: Any, by: str) -> dict[str, Any]:
    from gpuops.agent.wire.builtin_rules import advice

    tip = advice(hit.rule)
    return {"rule": hit.rule, "action": hit.action, "description": hit.description, "line": hit.line,
            "line_number": hit.line_number, "offset": hit.offset, "excerpt": hit.excerpt, "by": by,
            **({"advice": tip} if tip else {})}


class Viewer:
    """One view of one run: what has been seen, whether we stand in for its watchdog, and how it ends."""

    def __init__(self, play: Play, run_id: str, *, abort_on_match: bool, deadline: float | None, once: bool) -> None:
        self.play, self.run_id, self.target = play, run_id, play.target.name
        self.abort_on_match, self.deadline, self.once = abort_on_match, deadline, once
        self.matcher: Any = None
        self.log_tail = b""  # the log's last bytes: a failed run's outcome quotes its last line
        self.held: list[Any] = []  # our matches the watchdog has not reached yet
        self.reported: set[tuple[str | None, int | None]] = set()  # (rule, offset) the watchdog reported
        self.shown: set[tuple[str, int]] = set()  # (rule, offset) we matched and showed ourselves
        self.wd_offset = -1
        self.standing_in = False  # True: the watchdog is gone and we apply the run's rules ourselves
        self.first_abort: Any = None
        self.session_gone = False  # the watchdog saw the session vanish under a running command
        self.missing = 0
        self.stall_said = False
        self.newer_said = False  # the run's records were written by a newer gpuops: said once
        self.attempts = 1  # the run's attempts so far (the watchdog's `restart` events say when one begins)
        self.ended_attempts: list[dict[str, Any]] = []  # how each earlier attempt ended (for JUnit)
        self.new_stall_clock()

    def new_stall_clock(self) -> None:
        from gpuops.client.runspec import plain

        w = self.play.playbook.watch
        self.stall = StallClock(w.stall_timeout, plain(getattr(w, "stall_auto", None)), time.monotonic())

    def new_attempt(self, rec: dict[str, Any]) -> None:
        """The watchdog restarts training: what was seen belongs to the attempt before (the log resets itself)."""
        n = rec.get("attempt")
        self.attempts = max(self.attempts, n if isinstance(n, int) and not isinstance(n, bool) else self.attempts + 1)
        if isinstance(rec.get("previous"), dict):
            self.ended_attempts.append(rec["previous"])
        self.first_abort, self.reported, self.held, self.wd_offset = None, set(), [], -1
        self.session_gone, self.stall_said, self.missing = False, False, 0
        self.new_stall_clock()

    def event(self, kind: str, **data: Any) -> Event:
        return Event(kind, self.target, self.run_id, data)

    # -- what the follower says ------------------------------------------------------------
    def on_data(self, ev: Data) -> Iterator[Event | Outcome]:
        self.log_tail = (self.log_tail + ev.data)[-4096:]
        self.stall.grew(time.monotonic())
        self.stall_said = False
        if self.matcher is None:
            self.matcher = build_matcher(self.play, ev.offset)
        yield self.event("log", offset=ev.offset, bytes=ev.data)
        if self.once:
            return  # plain `gpuops logs` prints the log; only --follow applies the rules to it
        for name, seconds in self.matcher.guard.take_disabled():
            if self.standing_in:  # else the watchdog, running the same rules, reports it
                yield self.event("rule_disabled", rule=name, seconds=round(seconds, 3), by="client")
        for hit in self.matcher.feed(ev.data):
            if self.standing_in and hit.offset >= self.wd_offset:
                yield from self.own_hit(hit)
            elif not self.standing_in:
                self.held.append(hit)

    def own_hit(self, hit: Any) -> Iterator[Event | Outcome]:
        """A match we act on ourselves (the watchdog is gone and never reported it)."""
        if (hit.rule, hit.offset) in self.reported:
            return
        self.shown.add((hit.rule, hit.offset))
        yield self.event("match", **_hit_data(hit, "client"))
        if hit.action == "abort" and self.first_abort is None:
            self.first_abort = hit
            if self.abort_on_match:
                yield from self.stop("match", hit)

    def on_watchdog(self, ev: WatchdogEvent) -> Iterator[Event]:
        """One record of the watchdog's: shown as the event it is; one this gpuops does not know (an older or a
        newer gpuops wrote it) as data, an `unknown_event`, never as keyword arguments."""
        rec = {k: v for k, v in ev.record.items() if k not in _ENVELOPE}
        kind = ev.record.get("event")
        version = ev.record.get("schema_version")
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        if newer and not self.newer_said:
            self.newer_said = True
            yield self.event("newer_run", version=version, this_version=SCHEMA_VERSION)
        if not isinstance(kind, str) or kind not in _KNOWN:
            yield Event("unknown_event", self.target, self.run_id, {"name": str(kind), "record": rec})
            return
        if kind == "session_gone":
            self.session_gone = True
        if kind == "restart":
            self.new_attempt(rec)
        if kind == "match":
            key = (rec.get("rule"), rec.get("offset"))
            self.reported.add(key)
            if rec.get("offset") is not None and key in self.shown:
                return  # a watchdog that came back found the line we already showed (and acted on)
            if rec.get("action") == "abort" and self.first_abort is None:
                self.first_abort = rec
        if kind in _SHOWN:
            yield Event(kind, self.target, self.run_id, rec, newer=newer)
        else:
            yield Event("watchdog", self.target, self.run_id, {**rec, "what": kind}, newer=newer)

    def on_heartbeat(self, ev: Heartbeat) -> Iterator[Event | Outcome]:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            yield from self.timeout()
            return
        between = ev.watchdog_state == RESTARTING  # the next attempt waits: its log does not exist yet
        self.missing = self.missing + 1 if ev.size == -2 and not between else 0
        if between:
            self.stall.grew(time.monotonic())
        if self.missing == 2:  # not a rotation's brief gap: said once
            yield self.event("log_missing", log=f"~/.gpuops/runs/{self.run_id}/log")
        if self.once:
            return
        alive = 0 <= ev.watchdog_age < HEARTBEAT_STALE
        if alive:
            self.wd_offset = max(self.wd_offset, ev.watchdog_offset)
            self.held = [h for h in self.held if h.offset >= self.wd_offset]
            if self.standing_in:
                self.standing_in = False
                yield self.event("watchdog_back", age=round(ev.watchdog_age, 1))
        elif not self.standing_in and ev.watchdog_state != "done":
            self.standing_in = True
            age = None if ev.watchdog_age < 0 else round(ev.watchdog_age, 1)
            yield self.event("watchdog_stale", age=age, stale_after=HEARTBEAT_STALE)
            held, self.held = self.held, []
            for hit in held:
                yield from self.own_hit(hit)
        if self.standing_in:
            yield from self.check_stall(ev)

    def check_stall(self, ev: Heartbeat) -> Iterator[Event | Outcome]:
        """Our own stall clock, while the watchdog is gone (it counts from the log's mtime on the target)."""
        if ev.size == -1 or self.stall_said:
            return
        silent = ev.now - ev.mtime
        limit = self.stall.timeout_now(time.monotonic())
        if limit <= 0 or silent < limit:
            return
        note = {"log_missing": True} if ev.size == -2 else {}
        yield self.event("stall", seconds=round(silent, 1), stall_timeout=limit, by="client", **note)
        if self.abort_on_match:
            yield from self.stop("stall", None, seconds=round(silent, 1), last_line=last_line(self.log_tail, self.play), **note)
        self.stall_said = True  # --no-abort never stops the run

    # -- stopping -----------------------------------------------------------------------------
    def stop(self, reason: str, hit: Any, **extra: Any) -> Iterator[Event]:
        """Claim the abort and stop the run; if someone else stopped it first, say so."""
        yield self.event("abort_start", reason=reason, rule=hit.rule if hit else None, by="client")
        result = abort_run(self.play, self.run_id, reason, by="client" if reason != "timeout" else "timeout",
                           rule=hit.rule if hit else None, line=hit.line if hit else None,
                           excerpt=hit.excerpt if hit else None, extra=extra or None)
        yield self.aborted(result, reason)

    def aborted(self, result: AbortReply, reason: str) -> Event:
        if not result.won:
            return self.event("stopped_elsewhere", reason=result.record.get("reason"), stopped_by=result.by,
                              rule=result.record.get("rule"))
        return self.event("aborted", reason=reason, survivors=result.survivors, gpus=result.gpus, held_by=result.held_by,
                          seconds=round(result.seconds, 3), session_gone_at=result.session_gone_at, by=result.by)

    def timeout(self) -> Iterator[Event | Outcome]:
        yield self.event("timeout")
        result = abort_run(self.play, self.run_id, "timeout", by="timeout")
        yield self.aborted(result, "timeout")
        yield from self.finish(Ended("abort", None))

    # -- the end ------------------------------------------------------------------------------
    def on_end(self, ev: Ended) -> Iterator[Event | Outcome]:
        if self.matcher is not None and not self.once:
            for hit in self.matcher.finish():
                if self.standing_in:
                    yield from self.own_hit(hit)
        if ev.how == "once":
            yield Outcome("printed", ExitCode.OK, "", {"run": self.run_id})
            return
        if ev.how.startswith("container-"):
            yield ended_outcome(self.play, self.run_id, None, container=ev.how[len("container-"):])
            return
        if self.standing_in and ev.how != "abort":
            yield from self.settle_alone(ev)
        yield from self.finish(ev)

    def settle_alone(self, ev: Ended) -> Iterator[Event | Outcome]:
        """Without a watchdog: an abort rule the run outlived still decides, and what is left is reaped."""
        if self.first_abort is not None and self.abort_on_match and hasattr(self.first_abort, "rule"):
            yield from self.stop("match", self.first_abort)
            return
        try:
            survivors = self.play.door.kill_marked(self.run_id)
        except ContainerNotRunning:
            return
        if survivors:
            yield self.event("survivors", pids=survivors)

    def finish(self, ev: Ended) -> Iterator[Outcome]:
        if self.session_gone and ev.how == "exit":
            ev = Ended("gone", None)  # its exit code is the reap's, not the run's own
        out = ended_outcome(self.play, self.run_id, ev, first_abort=self.first_abort, abort_on_match=self.abort_on_match,
                            last=last_line(self.log_tail, self.play))
        out.data["attempts"] = self.attempts
        if self.attempts > 1:
            out.message += f" (attempt {self.attempts}, after {self.attempts - 1} restart{'s' if self.attempts > 2 else ''})"
        if self.ended_attempts:
            out.data["earlier_attempts"] = self.ended_attempts
        yield out


def view(
    play: Play,
    run_id: str,
    *,
    tail: int = -1,
    abort_on_match: bool = True,
    deadline: float | None = None,
    once: bool = False,
) -> Iterator[Event | Outcome]:
    """Yield log, watchdog and match events; the last item is the Outcome."""
    follower = LogFollower(play.door, run_id, play.session, tail=tail, once=once)
    v = Viewer(play, run_id, abort_on_match=abort_on_match, deadline=deadline, once=once)
    try:
        for ev in follower:
            if isinstance(ev, Data):
                items = v.on_data(ev)
            elif isinstance(ev, WatchdogEvent):
                items = v.on_watchdog(ev)
            elif isinstance(ev, Heartbeat):
                items = v.on_heartbeat(ev)
            elif isinstance(ev, Reset):
                v.matcher, v.log_tail = None, b""
                items = iter([v.event("log_reset", why=ev.why)])
            elif isinstance(ev, Reconnecting):
                items = iter([v.event("reconnecting", error=ev.error, attempt=ev.attempt)])
            elif isinstance(ev, Reconnected):
                items = iter([v.event("reconnected", offset=ev.offset)])
            elif isinstance(ev, Ended):
                items = v.on_end(ev)
            else:
                continue
            for item in items:
                yield item
                if isinstance(item, Outcome):
                    return
            if v.deadline is not None and time.monotonic() >= v.deadline and not isinstance(ev, Heartbeat):
                for item in v.timeout():
                    yield item
                    if isinstance(item, Outcome):
                        return
    finally:
        follower.close()
