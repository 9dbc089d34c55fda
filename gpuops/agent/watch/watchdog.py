"""Watch one run from beside it: log -> matcher -> stall clock -> detectors -> the one abort.

Runs on the target, started by the supervisor (supervise.py) before the training command, so
it reads the log from byte 0. It needs no client: it applies the rules the run was launched
with (watch.json), stops the run itself through abort.py, writes its decisions to events.jsonl
(append-only) and its heartbeat and resume point to watchdog.json every second. Killed, it is
started again and carries on from its last checkpoint: matches already reported (same rule,
same offset) are not reported twice, and none is lost.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from ..detect import hardware
from ..detect.detectors import figure_rules
from ..detect.quiet_failures import Quiet
from ..notify.outbox import Notifier
from ..run import restart as restarts
from ..run.abort import claim, reap, stop_run
from ..run.liveness import Liveness
from ..run.prepare import append_event, set_aside
from ..system.wake import Waker
from ..wire import protocol as p
from ..wire import watchfile
from ..wire.builtin_rules import advice
from ..wire.detector_list import finding_key
from ..wire.masking import Masker
from ..wire.records import read_json, read_text
from ..wire.ruleset import build_matcher
from ..wire.stall import StallClock
from ..wire.watchfile import WatchConfig
from .duties import DUTIES, D, Duty, Heartbeat, Metrics, Pass, Stall
from .heartbeat import EventLog, Pulse
from .joblink import JobLink
from .logfile import LogFile

READ = 1 << 20
#: After this many reports of one warn rule, further matches are counted, not reported.
MAX_REPORTS = 100
#: Reported matches a restarted watchdog remembers (to report none twice); older ones are past its checkpoint.
MAX_REMEMBERED = 10000


class Watchdog:
    """One run's watchdog: call run() once."""

    def __init__(self, d: str, cfg: WatchConfig, notifier: Optional[Notifier] = None) -> None:
        self.d, self.cfg = d, cfg
        self.run_id = os.path.basename(d)
        self.session = cfg.session
        self.masker = Masker(list(cfg.secrets))
        self.events = EventLog(d, (notifier or Notifier(d, cfg)).saw)  # playbook `notify:` (agent/notify)
        self.state_path = os.path.join(d, p.WATCHDOG)
        self.attempt = restarts.current(d)
        state = read_json(self.state_path) or {}
        if state.get("attempt", 1) != self.attempt["attempt"] or state.get("state") == p.WATCHDOG_RESTARTING:
            state = {}  # the heartbeat of the attempt before: this one starts from byte 0
        self.started = float(state.get("started") or time.time())
        self.offset = int(state.get("safe_offset") or 0)
        self.line = int(state.get("safe_line") or 1)
        self.inode = int(state.get("inode") or 0)
        self.safe = (self.offset, self.line)
        self.matcher = build_matcher(cfg, self.offset, self.line, self.masker, figure_rules=figure_rules(cfg.detectors))
        self.stall = StallClock(cfg.stall.timeout, cfg.stall.auto, time.monotonic() - (time.time() - self.started))
        if state.get("stall"):
            self.stall.restore(state["stall"])
        self.log = LogFile(d, self.offset, self.inode)  # through rewrites, renames and deletes
        self.status = "watching"
        self.first_abort: Optional[Any] = None
        self.aborter: Optional[threading.Thread] = None
        self.claimed_by: Optional[str] = None
        self.session_seen = bool(state.get("session_seen"))
        self.live = Liveness(d, self.session, self.run_id, self.session_seen)
        #: Woken by the log and the run's records (inotify), not polling them; its own records wake nobody.
        self.waker = Waker(d, [p.LOG], quiet=(p.WATCHDOG, p.EVENTS, p.SAMPLES, p.SAMPLES_COARSE, p.CACHE_SNAPSHOT, p.NOTIFY))
        self.write_failing = False
        self.restarts = int(state.get("restarts") or 0) + (1 if state else 0)
        self.link = JobLink(self)  # a node of a torchrun job: one node's end ends every node
        self.quiet = Quiet(d, cfg, self.started, peers=self.link.peers())
        self.retry_abort: Optional[Tuple[str, Dict[str, Any]]] = None
        self.pulse = Pulse()
        self.next_attempt = False  # set when this attempt ended and the watchdog restarts training
        self.over = False  # the attempt ended: finish() runs
        #: What each pass of run() offers itself to, in order; each runs when due (duties.py).
        self.duties: Dict[type, Duty] = {kind: kind(self) for kind in DUTIES}

    def duty(self, kind: Type[D]) -> D:
        """The watchdog's duty of this class."""
        return self.duties[kind]  # type: ignore[return-value]

    # -- the log --------------------------------------------------------------------------
    def read_log(self) -> int:
        """Feed what the log has beyond the offset to the matcher; the bytes that came (fewer than READ:
        the log's end was reached)."""
        data, why = self.log.read(READ)
        self.inode = self.log.inode
        if why:
            self.reset(why)
        if not data:
            return 0
        self.offset = self.log.offset
        self.stall.grew(time.monotonic())
        self.duty(Stall).said = False  # a new silence is said again
        for hit in self.matcher.feed(data):
            self.on_hit(hit)
        now = time.time()
        for measure in self.matcher.take_measures():
            self.quiet.measure(measure.rule, measure.value, now)
        self.after_feed()
        return len(data)

    def reset(self, why: str) -> None:
        self.offset, self.line = 0, 1
        self.matcher = build_matcher(self.cfg, 0, 1, self.masker, figure_rules=figure_rules(self.cfg.detectors))
        self.events.write("log_reset", why=why)

    def after_feed(self) -> None:
        for name, seconds in self.matcher.guard.take_disabled():
            self.events.write("rule_disabled", rule=name, seconds=round(seconds, 3),
                              message="rule '%s' took %.1fs on one line (its pattern backtracks catastrophically); "
                                      "it is no longer applied, the other rules are" % (name, seconds))
        point = self.matcher.checkpoint()
        if point is not None:
            self.safe = point

    def on_hit(self, hit: Any) -> None:
        key = (hit.rule, hit.offset)
        if key in self.events.reported:
            # Reported before a restart; an abort it asked for that was never claimed is claimed now.
            if hit.action == "abort" and self.first_abort is None and not os.path.exists(os.path.join(self.d, p.ABORT)):
                self.first_abort = hit
                self.abort("match", rule=hit.rule, line=hit.line, excerpt=hit.excerpt)
            return
        self.events.reported.add(key)
        if len(self.events.reported) > MAX_REMEMBERED:
            self.events.reported = {k for k in self.events.reported if k[1] is not None and k[1] >= self.safe[0]}
        count = self.events.counts.get(hit.rule, 0) + 1
        self.events.counts[hit.rule] = count
        if hit.action == "abort" or count <= MAX_REPORTS:
            self.events.write("match", rule=hit.rule, action=hit.action, description=hit.description, line=hit.line,
                              line_number=hit.line_number, offset=hit.offset, excerpt=hit.excerpt,
                              **({"advice": advice(hit.rule)} if advice(hit.rule) else {}))
        if hit.action == "abort" and self.first_abort is None:
            self.first_abort = hit
            self.abort("match", rule=hit.rule, line=hit.line, excerpt=hit.excerpt)

    def on_finding(self, f: Any) -> None:
        key = finding_key(f.rule, f.figures)
        if key in self.events.findings:
            return  # reported before a restart
        self.events.findings.add(key)
        if f.action == "note":
            self.events.write("note", rule=f.rule, message=f.message, advice=f.advice, figures=f.figures)
            return
        self.events.write("match", rule=f.rule, action=f.action, description=f.message, line=f.message,
                          message=f.message, advice=f.advice, figures=f.figures, offset=None, line_number=None,
                          excerpt=f.message + "\n" + f.advice)
        if f.action == "abort" and self.first_abort is None:
            self.first_abort = f
            if hardware.is_hardware(f) and self.status == "watching" and hardware.read(self.d) is None:
                hardware.write(self.d, hardware.from_finding(f))  # before the claim: every reader of it sees both
            self.abort("match", rule=f.rule, line=f.message, excerpt=f.message + "\n" + f.advice, figures=f.figures)

    # -- stopping the run ---------------------------------------------------------------------
    def abort(self, reason: str, **why: Any) -> None:
        """Claim the abort and run the sequence in the background (heartbeats go on meanwhile)."""
        if self.status != "watching":
            return
        record = {"reason": reason, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "signal": self.cfg.abort.signal, "grace": self.cfg.abort.grace, "by": "watchdog", "pid": os.getpid()}
        record.update({k: v for k, v in why.items() if v is not None})
        try:
            won, current = claim(self.d, record)
        except OSError:  # the claim could not be written (a full disk): claimed at the next try
            self.retry_abort = (reason, why)
            return
        self.retry_abort = None
        if not won:
            self.seen_claim(current)
            return
        self.status = "aborting"
        # A stalled torchrun job's verdict comes with the sequence: its notification waits for the `aborted` event.
        pending = {"verdict_pending": True} if self.link.active and p.RESTART_STALL in (
            reason, why.get("first_reason")) else {}
        self.events.write("abort_start", reason=reason, rule=why.get("rule"), **pending)

        def sequence() -> None:
            self.link.publish(reason, settle=True, **why)  # the other nodes of a torchrun job learn it first
            result = stop_run(self.d, self.cfg, self.link.gather)
            self.events.write("aborted", reason=reason, rule=why.get("rule"), **pending, **result)

        self.start_aborter(sequence, "gpuops-abort")

    def start_aborter(self, sequence: Callable[[], Any], name: Optional[str] = None) -> None:
        """The abort sequence (or the finish of an orphaned one), in the background: heartbeats go on."""
        self.aborter = threading.Thread(target=sequence, name=name, daemon=True)
        self.aborter.start()

    def seen_claim(self, record: Dict[str, Any]) -> None:
        """Someone else stopped the run (a client, `gpuops stop`, --timeout): say so once, do not signal."""
        if self.status == "watching":
            self.status = "aborting"
            self.claimed_by = str(record.get("by") or "?")
            self.link.publish(str(record.get("reason")), by=self.claimed_by, rule=record.get("rule"))
            self.events.write("stopped_elsewhere", reason=record.get("reason"), stopped_by=self.claimed_by,
                              rule=record.get("rule"))

    # -- the end ------------------------------------------------------------------------------
    def ended(self, now: float) -> bool:
        """The run is over: its command exited or its session is gone, and any abort finished."""
        gone = self.live.gone(now)  # always asked: it lets go of a pidfd whose process ended
        over = os.path.exists(os.path.join(self.d, p.EXIT_CODE)) or gone
        self.session_seen = self.live.seen
        if not over:
            return False
        if os.path.exists(os.path.join(self.d, p.ABORT)):
            return os.path.exists(os.path.join(self.d, p.ABORT_DONE))
        return True

    def finish(self) -> None:
        """Reap what is left (a worker can outlive its session and keep writing), drain the log,
        settle a match the run outlived, record the end."""
        self.link.at_end()
        self.over = True
        self.duty(Heartbeat).beat(force=True)  # says at once whether a restart is due: a stop from now on must end it for good
        ending = None
        if not os.path.exists(os.path.join(self.d, p.ABORT)):
            vanished = not os.path.exists(os.path.join(self.d, p.EXIT_CODE))
            ending = "lost" if vanished else None
            survivors = reap(self.run_id)
            if vanished:  # the status the command then ended with is the reap's SIGTERM, not its own: lost
                set_aside(self.d, p.EXIT_CODE, p.EXIT_CODE_REAPED)
                self.events.write("session_gone", message="the run's tmux session is gone while its command ran "
                                  "(killed by hand?); what was left of the run was stopped")
            if survivors:
                self.events.write("survivors", pids=survivors)
        for _ in range(10000):  # nothing writes any more; the bound is for a writer that survived SIGKILL
            if not self.read_log():
                break
        for hit in self.matcher.finish():
            self.on_hit(hit)
        if self.aborter is not None:
            self.aborter.join()
        self.waker.close()
        self.live.close()
        after = self.hardware_end(ending)
        self.link.close(store_gone=after is not None)
        try:
            self.quiet.finish()
        except Exception as exc:  # the run is over either way; its profile is a convenience
            self.events.write("profile_failed", message="%s: %s" % (type(exc).__name__, exc))
        if after is not None:  # the attempt's records (its profile too) are kept; the next attempt waits
            self.status, self.next_attempt = p.WATCHDOG_RESTARTING, True
            restarts.heartbeat(self.d, restarts.begin_next(self.d, self.cfg, after, self.events.write), force=True)
            self.pulse.beat()
            self.duty(Metrics).now()
            return
        self.status = "done"
        self.events.write("done")
        self.duty(Heartbeat).beat(force=True)
        self.duty(Metrics).end()

    def hardware_end(self, ending: Optional[str]) -> Optional[str]:
        """The rule to restart after, once the run's GPUs had their say: a stall, crash or lost run whose window holds
        an Xid that needs a reset is reported as the Xid (hardware.json), and no restart starts on a GPU that needs
        a reset (`restart_failed` says why; the run ends `hardware`)."""
        after = restarts.due(self.d, self.cfg, own=True)  # what the attempt's own end asks for
        abort = read_json(os.path.join(self.d, p.ABORT)) or {}
        if ending is None:
            code = (read_text(os.path.join(self.d, p.EXIT_CODE)) or "").strip()
            ending = "stall" if abort.get("reason") == "stall" else (
                "failed" if not abort and code not in ("", "0") else None)
        try:
            if ending is not None:
                hardware.explain(self, ending, wait=ending != "stall")
            blocked = hardware.blocks_restart(self) if after is not None else None
        except OSError as exc:  # its record cannot be written: the run ends as it would have
            self.note_write_error(exc)
            return after
        if blocked is None:
            return after
        gpu = blocked.get("gpu") or {}
        self.events.write("restart_failed", attempt=int(self.attempt["attempt"]) + 1, message=blocked["restart_blocked"],
                          rule=blocked.get("rule"), figures={"gpu": gpu.get("index"), "bus_id": gpu.get("bus_id"),
                                                             "uuid": gpu.get("uuid"),
                                                             "xid": (blocked.get("xid") or {}).get("code"),
                                                             "counter": blocked.get("counter")})
        return None

    def note_write_error(self, exc: OSError) -> None:
        """Said once per spell of failing writes (when it can be written): the watching goes on."""
        if not self.write_failing:
            self.write_failing = True
            self.events.write("write_failed", message="cannot write the run's records (%s); the watchdog goes on "
                              "watching and writes them once it can" % (exc.strerror or exc))

    def run(self) -> int:
        if self.restarts:
            self.events.write("watchdog_resumed", offset=self.safe[0], restarts=self.restarts)
        self.duty(Heartbeat).beat(force=True)
        ready: List[int] = []
        while True:
            got = self.read_log()
            if got and self.waker.timed_out:
                self.waker.missed()  # the log grew and no event said so
            # Fewer bytes than asked for: the log's end. One pass per wake, then the wait (a write
            # that lands after the read is an event the wait returns for at once).
            at_end = got < READ
            w = Pass(self, time.time(), time.monotonic(), at_end, bool(ready))
            for duty in self.duties.values():
                duty(w)
            if w.look and not os.path.isdir(self.d):  # the run's records were deleted: nothing to write to
                return 0
            if at_end and w.look and self.ended(w.now):
                self.finish()
                return 0
            if at_end:
                fds = self.quiet.fds() + self.live.fds() + self.link.fds()
                ready = self.waker.wait(self.wait_for(), fds, self.live.hangups())
                self.live.saw(ready)
            else:
                ready = []

    def wait_for(self) -> float:
        """Seconds to sleep at most: until the next heartbeat (or metrics render); short while an abort is under way."""
        left = min(self.duty(Heartbeat).next_at, self.duty(Metrics).wake_at()) - time.time()
        busy = self.status != "watching" or self.retry_abort is not None
        return min(left, 0.1) if busy else left


def main(argv: list) -> int:
    (run_id,) = argv
    d = p.run_dir(run_id)
    lock = open(os.path.join(d, p.WATCHDOG_LOCK), "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one watchdog per run: a second waits for the first to end
    cfg = watchfile.read(d)
    if cfg is None:
        sys.stderr.write("watchdog: no readable %s in %s\n" % (p.WATCH, d))
        return 3
    # Killed is not done: the supervisor starts the watchdog again unless watchdog.json says done.
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(128 + signal.SIGTERM))
    pulse = Pulse()  # the supervisor hears the watchdog while the next attempt waits, too
    notifier = Notifier(d, cfg)  # the next attempt's start (`restarted`) is told as the watchdog's events are

    def say(event: str, **data: Any) -> None:
        append_event(d, event, **data)
        notifier.saw(event, data)

    def beat(rec: Dict[str, Any]) -> None:
        if restarts.heartbeat(d, rec):  # it beat: the supervisor is pulsed (a wait is no freeze)
            pulse.beat()

    while True:
        ready = restarts.carry_out(d, cfg, beat, say)
        wd = Watchdog(d, cfg, notifier)
        if not ready:  # stopped (or failed to start) while the next attempt waited: the run ends here
            wd.finish()
            return 0
        code = wd.run()
        if not wd.next_attempt:
            return code


tool_watchdog = main
