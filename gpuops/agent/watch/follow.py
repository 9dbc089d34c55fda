"""Follow a run's log (and its watchdog's events) by byte offset, as frames on stdout.

Runs on the target: ``python3 -m gpuops_agent follow RUN_ID SESSION OFFSET INODE TAIL ONCE EVENTS_OFFSET``.
The frames are defined in protocol.py. The client resumes after a dropped connection by
starting it again at the offsets it has, so nothing is lost or repeated.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import BinaryIO, Optional

from ..run.abort import claimer_dead, finish_orphan
from ..run.liveness import Liveness
from ..system.procs import running
from ..system.wake import Waker
from ..wire import protocol as p
from ..wire import watchfile
from .logfile import LogFile

#: Once the run ended, wait at most this long for a live watchdog to write its last records.
WATCHDOG_GRACE = 15.0
#: A stopped run whose session is gone: wait at most this long for the aborter's final record.
ABORTER_GRACE = 120.0


def tail_offset(path: str, n: int) -> int:
    """The offset where the last n lines of the file start."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, 2)
            pos, seen = end, 0
            while pos > 0:
                step = min(65536, pos)
                pos -= step
                fh.seek(pos)
                buf = fh.read(step)
                if pos + step == end and buf.endswith(b"\n"):
                    buf = buf[:-1]
                for i in range(len(buf) - 1, -1, -1):
                    if buf[i] == 10:
                        seen += 1
                        if seen == n:
                            return pos + i + 1
            return 0
    except OSError:
        return 0


def _read(path: str, limit: int = 65536) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


class Follower:
    """The state of one follow: where the log and the events file are read up to."""

    def __init__(self, d: str, session: str, offset: int, inode: int, events_offset: int, once: bool) -> None:
        self.d, self.session, self.once = d, session, once
        self.log = os.path.join(d, p.LOG)
        self.offset, self.inode, self.events_offset = offset, inode, events_offset
        self.out: BinaryIO = sys.stdout.buffer
        self.logf = LogFile(d, offset, inode)
        self.opened = False  # the log was open once: a new file at its path is then a rotation
        self.size, self.mtime = -1, 0.0
        self.live = Liveness(d, session, os.path.basename(d), seen=True)
        #: Woken by the log, the events and the run's records (inotify), not polling them.
        self.waker = Waker(d, [p.LOG, p.EVENTS], quiet=(p.WATCHDOG, p.SAMPLES, p.SAMPLES_COARSE, p.CACHE_SNAPSHOT))
        self.gone_since: Optional[float] = None
        self.finisher: Optional[threading.Thread] = None
        self.last_orphan_check = 0.0
        self.attempt = self.attempt_now()[0]

    def w(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()

    def pump_log(self) -> bool:
        """Send what the log has beyond the offset; True if bytes (or a reset) were sent. The log is read
        through rewrites, renames and deletes (logfile.py): a renamed or deleted log is read on while
        the job writes it."""
        had_file = self.logf.fh is not None
        data, why = self.logf.read(1 << 20)
        self.inode = self.logf.inode
        if self.logf.fh is None:
            if self.size != -2:
                self.size, self.mtime = -2, self.mtime or time.time()
            return False
        sent = False
        if why == "the log was replaced":
            if had_file or self.opened:
                self.w(p.rotated_frame())
                sent = True
        elif why:
            self.w(p.truncated_frame(self.inode))
            sent = True
        self.opened = True
        if data:
            self.offset = self.logf.offset
            self.w(p.data_frame(self.inode, self.offset - len(data), data))
            return True
        self.offset = self.logf.offset
        try:
            st = os.fstat(self.logf.fh.fileno())
            self.size, self.mtime = st.st_size, st.st_mtime
        except OSError:
            pass
        return sent

    def pump_events(self) -> bool:
        """Send the watchdog's events beyond their offset, whole lines only."""
        if self.once:
            return False
        try:
            with open(os.path.join(self.d, p.EVENTS), "rb") as fh:
                fh.seek(self.events_offset)
                data = fh.read(1 << 20)
        except OSError:
            return False
        end = data.rfind(b"\n") + 1
        if not end:
            return False
        self.w(p.events_frame(self.events_offset, data[:end]))
        self.events_offset += end
        return True

    def watchdog(self, now: float) -> tuple:
        """(heartbeat age, offset matched, state) of the run's watchdog; age -1 when it never wrote one."""
        text = _read(os.path.join(self.d, p.WATCHDOG))
        try:
            record = json.loads(text.decode()) if text else None
        except ValueError:
            record = None
        if not isinstance(record, dict):
            return -1.0, -1, "-"
        ts = record.get("ts")
        age = max(0.0, now - ts) if isinstance(ts, (int, float)) else -1.0
        state = str(record.get("state") or "-")
        if state != "done" and not self.watchdog_processes(record):
            age = max(age, p.HEARTBEAT_STALE + 1)  # gone for good (no supervisor either): no need to wait it out
        return age, int(record.get("offset") or 0), state

    def watchdog_processes(self, record: dict) -> bool:
        """Whether the watchdog or its supervisor (which would start it again) is alive."""
        pids = [record.get("pid")]
        text = _read(os.path.join(self.d, p.SUPERVISOR_PID), 32)
        if text and text.strip().isdigit():
            pids.append(int(text.strip()))
        return any(isinstance(pid, int) and pid > 0 and running(pid) for pid in pids)

    def attempt_now(self) -> tuple:
        """(number, state) of the run's current attempt (attempt.json; absent: 1, running)."""
        text = _read(os.path.join(self.d, p.ATTEMPT))
        try:
            record = json.loads(text.decode()) if text else {}
        except ValueError:
            record = {}
        n = record.get("attempt") if isinstance(record, dict) else None
        return (n, str(record.get("state"))) if isinstance(n, int) else (1, p.ATTEMPT_RUNNING)

    def next_attempt(self) -> bool:
        """The watchdog restarts training: the end seen was an attempt's, not the run's (follow the next)."""
        n, state = self.attempt_now()
        if n != self.attempt:
            self.attempt, self.gone_since = n, None
            # The ended attempt's log (moved to attempts/<n-1>/, open here) to its end, then the new attempt's
            # from byte 0 at once: waiting out the log's switch delay lost a short attempt's lines.
            while self.pump_log():
                pass
            self.logf.close()
            self.logf.moved_on = True
            return True
        return state in p.ATTEMPT_PENDING

    def ended(self, now: float) -> Optional[bytes]:
        """The end frame, once the run ended: abort (the abort sequence finished), exit, or gone."""
        if os.path.exists(os.path.join(self.d, p.ABORT_DONE)):
            return p.end_frame("abort", None)
        aborting = os.path.exists(os.path.join(self.d, p.ABORT))
        if aborting:
            self.finish_orphan(now)
        code = self.exit_code()
        if code is not None and not aborting:
            return p.end_frame("exit", code)
        if not self.session or not self.live.gone(now):  # a tmux error is no end
            return None
        code = self.exit_code()  # again: run.sh writes it just before its session ends
        if not aborting:
            return p.end_frame("exit", code) if code is not None else p.end_frame("gone", None)
        # Stopped, session gone: the aborter is reaping and draining. Wait for its record, within reason.
        self.gone_since = self.gone_since or now
        return p.end_frame("abort", None) if now - self.gone_since > ABORTER_GRACE else None

    def finish_orphan(self, now: float) -> None:
        """A claimed abort whose claimer died (the watchdog and its supervisor killed in the grace): this
        follow finishes it, in the background, as the watchdog would (kill, reap, drain; no second signal)."""
        if self.finisher is not None or now - self.last_orphan_check < 1.0:
            return
        self.last_orphan_check = now
        if claimer_dead(self.d):
            cfg = watchfile.read(self.d)
            self.finisher = threading.Thread(target=finish_orphan, args=(self.d, cfg), name="gpuops-finish")
            self.finisher.start()  # not a daemon: a client that goes away does not cut the sequence short

    def exit_code(self) -> Optional[int]:
        text = _read(os.path.join(self.d, p.EXIT_CODE), 64)
        if text is None:
            return None
        text = text.strip()
        if not text:  # created, not written yet (inotify wakes us between the two): not an end yet
            return None
        return int(text) if text.lstrip(b"-").isdigit() else -1

    def run(self) -> None:
        last_hb = 0.0
        end: Optional[bytes] = None
        end_seen = 0.0
        while True:
            got = self.pump_log()
            got = self.pump_events() or got
            now = time.time()
            if not got:
                if self.once:
                    self.w(p.end_frame("once", None))
                    return
                if end is None:
                    end = self.ended(now)
                    end_seen = now
                if end is not None and self.next_attempt():
                    end = None  # the log moved to attempts/<n>/ (an R frame); the next attempt's comes from 0
                if end is not None:
                    age, _, state = self.watchdog(now)
                    live = 0 <= age < p.HEARTBEAT_STALE and state != "done"
                    if not live or now - end_seen > WATCHDOG_GRACE:
                        self.pump_events()
                        self.w(end)
                        return
                wait = p.HEARTBEAT_EVERY / 10 if end is not None else last_hb + p.HEARTBEAT_EVERY - now
                self.live.saw(self.waker.wait(wait, self.live.fds(), self.live.hangups()))
            if now - last_hb >= p.HEARTBEAT_EVERY:
                age, wd_offset, state = self.watchdog(now)
                self.w(p.heartbeat_frame(now, self.size, self.mtime, age, wd_offset, state))
                last_hb = now


def main(argv: list) -> int:
    run_id, session, offset, inode, tail, once, events_offset = argv
    d = p.run_dir(run_id)
    offset_n, tail_n = int(offset), int(tail)
    log = os.path.join(d, p.LOG)
    if tail_n >= 0 and offset_n == 0:
        offset_n = tail_offset(log, tail_n) if tail_n > 0 else (os.path.getsize(log) if os.path.exists(log) else 0)
    try:
        Follower(d, session, offset_n, int(inode), int(events_offset), once == "1").run()
    except BrokenPipeError:  # the client went away: nothing to tell anyone
        return 0
    return 0
