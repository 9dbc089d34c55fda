"""The watchdog's metrics (playbook `watch.metrics`): the run's snapshot rendered every sample interval and
offered to each place it goes (outlets.py); at the run's end the final one, then a process that takes the
series away `keep_ended` seconds later (expire.py).

The textfile is rewritten every sample interval. The Pushgateway gets a PUT when anything but the clocks (the
heartbeat, the log's silence) changed, at least every PUSH_EVERY seconds (its push_time_seconds then says the
watchdog lives), and at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

from .. import LIB
from ..wire import protocol as p
from ..wire.metric_table import RunSnapshot, render
from ..wire.watchfile import WatchConfig
from .outlets import Outlet, group_url, push, sweep, textfile_name, write_textfile
from .reading import Reader

#: The Pushgateway hears from a live run at least this often (seconds), changed or not.
PUSH_EVERY = 30.0
#: At its end the watchdog waits this long at most for the final text to land (a slow place is not waited for).
FINAL_WAIT = 2.0


def _unclocked(snap: RunSnapshot) -> RunSnapshot:
    return replace(snap, heartbeat_at=None, heartbeat_age_seconds=None, log_silence_seconds=None)


class Publisher:
    """One run's metrics from its watchdog."""

    def __init__(self, d: str, cfg: WatchConfig, mask: Callable[[str], str]) -> None:
        self.d, self.cfg = d, cfg
        self.reader = Reader(d, cfg)
        job = cfg.job
        run_id = str(self.reader.meta.get("id") or cfg.run or os.path.basename(d))
        self.textfile: Optional[Outlet] = None
        self.pushgateway: Optional[Outlet] = None
        m = cfg.metrics
        if m.textfile:
            folder = os.path.expanduser(m.textfile)
            name = textfile_name(run_id, job.node_rank if job is not None else None)
            swept: List[bool] = []

            def deliver(text: str) -> None:
                if not swept:  # once, in the outlet's thread (a listing of a slow folder waits there)
                    swept.append(True)
                    sweep(folder, name)
                write_textfile(folder, name, text)

            self.textfile = Outlet("cannot write the run's metrics file in %s" % folder, deliver, mask)
        if m.pushgateway:
            url = group_url(m.pushgateway, run_id, job.node_name if job is not None else "")
            self.pushgateway = Outlet("cannot push the run's metrics to the Pushgateway",
                                      lambda text: push(url, text, mask), mask)
        self.pushed: Optional[RunSnapshot] = None
        self.pushed_at = 0.0

    def outlets(self) -> List[Outlet]:
        return [o for o in (self.textfile, self.pushgateway) if o is not None]

    def publish(self, now: float, beat: Optional[Dict[str, Any]], live: bool = True) -> List[str]:
        """Render the run now and offer it; the failures to say (once per spell)."""
        snap = self.reader.snapshot(now, beat, live)
        text = render([snap])
        if self.textfile is not None:
            self.textfile.offer(text)
        if self.pushgateway is not None:
            key = _unclocked(snap)
            if not live or key != self.pushed or now - self.pushed_at >= PUSH_EVERY:
                self.pushed, self.pushed_at = key, now
                self.pushgateway.offer(text)
        return self.warnings()

    def warnings(self) -> List[str]:
        return [w for w in (o.warning() for o in self.outlets()) if w]

    def end(self, now: float, beat: Optional[Dict[str, Any]]) -> List[str]:
        """The run ended: its final state offered (waited for FINAL_WAIT seconds at most), and its series taken
        away keep_ended seconds from now by a process of its own."""
        self.publish(now, beat, live=False)
        for outlet in self.outlets():
            outlet.flush(FINAL_WAIT)
        spawn_expire(os.path.basename(self.d))
        return self.warnings()


def expire_argv(run_id: str) -> List[str]:
    return [sys.executable, "-E", "-s", "-m", p.PACKAGE, "metrics-expire", run_id]


def spawn_expire(run_id: str) -> None:
    """expire.py in its own session: it outlives the watchdog and the run's reap."""
    try:
        subprocess.Popen(expire_argv(run_id), cwd=LIB, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:
        pass  # no process to spare: the file is swept by a later run's writer (outlets.sweep), the group stays
