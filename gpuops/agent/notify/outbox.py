"""notify.jsonl, the run's notifications, and the watchdog's side of them (the Notifier).

The watchdog tells the Notifier of every event it writes (one call, a queue put: nothing it does
waits on a notification). The Notifier's thread turns an event into a notification, records it as
queued in notify.jsonl under its key (what, attempt: one per event, whoever sees the event again),
and hands it to a detached sender process (`python3 -m gpuops_agent notify RUN_ID KEY`), which
outlives the watchdog (`ended` is sent as the run ends) and records each channel's delivery. A
watchdog started again by its supervisor reads notify.jsonl: a key queued before is not queued
again, and one whose sender died before it finished is handed to a new sender.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Set

from .. import LIB
from ..wire import protocol as p
from ..wire.masking import Masker
from ..wire.watchfile import WatchConfig
from .payload import build, key_of, what_of

QUEUED, SENT, FAILED, DONE = "queued", "sent", "failed", "done"


def append(d: str, record: Dict[str, Any]) -> None:
    """One line of notify.jsonl (O_APPEND: whole lines, whoever writes)."""
    record = {"schema_version": p.SCHEMA_VERSION, "ts": round(time.time(), 3), **record}
    fd = os.open(os.path.join(d, p.NOTIFY), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def records(d: str) -> List[Dict[str, Any]]:
    try:
        with open(os.path.join(d, p.NOTIFY), "rb") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    out = []
    for raw in lines:
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("key"), str):
            out.append(rec)
    return out


def folder(d: str) -> str:
    path = os.path.join(d, p.NOTIFY_DIR)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def payload_file(d: str, key: str) -> str:
    return os.path.join(d, p.NOTIFY_DIR, key + ".json")


def lock_file(d: str, key: str) -> str:
    return os.path.join(d, p.NOTIFY_DIR, key + ".lock")


def output_file(d: str, key: str, channel: int) -> str:
    return os.path.join(d, p.NOTIFY_DIR, "%s-%d.out" % (key, channel))


def sender_argv(run_id: str, key: str) -> List[str]:
    return [sys.executable, "-E", "-s", "-m", p.PACKAGE, "notify", run_id, key]


def spawn(d: str, key: str) -> None:
    """A sender for the notification, in its own session: it outlives the watchdog, and the run's reap."""
    subprocess.Popen(sender_argv(os.path.basename(d), key), cwd=LIB, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def busy(d: str, key: str) -> bool:
    """A sender holds the notification's lock now."""
    try:
        fh = open(lock_file(d, key), "a")
    except OSError:
        return False
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        fh.close()


class Notifier:
    """The watchdog's side: `saw(event, data)` for each event it writes; never blocks it (but at `done`)."""

    def __init__(self, d: str, cfg: WatchConfig) -> None:
        self.d, self.cfg = d, cfg
        self.channels = list(cfg.notify)
        self.wanted: Set[str] = {w for c in self.channels for w in c.on}
        self.masker = Masker(list(cfg.secrets))
        self.todo: "queue.Queue[Any]" = queue.Queue()
        self.thread: Optional[threading.Thread] = None
        self.known: Set[str] = set()
        if self.channels:
            self.resume()

    def resume(self) -> None:
        """What an earlier watchdog queued: known (never queued twice); unfinished with no sender: sent now."""
        done = set()
        for rec in records(self.d):
            self.known.add(rec["key"])
            if rec.get("state") == DONE:
                done.add(rec["key"])
        for key in sorted(self.known - done):
            self.todo.put(("resume", key))
        if not self.todo.empty():
            self._start()

    def saw(self, event: str, data: Dict[str, Any]) -> None:
        """An event of the run was written: a notification, if a channel wants it."""
        what = what_of(event, data) if self.wanted else None
        if what is not None and what in self.wanted:
            self.todo.put((what, dict(data)))
            self._start()
        if event == "done" and self.thread is not None:
            self.todo.join()  # the run is over and the watchdog ends: every notification handed over first

    def _start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="gpuops-notify", daemon=True)
            self.thread.start()

    def _work(self) -> None:
        while True:
            item = self.todo.get()
            try:
                self._one(*item)
            except Exception as exc:  # a notification must never take the watchdog down
                self._said_failed(item, exc)
            finally:
                self.todo.task_done()

    def _one(self, what: str, data: Any) -> None:
        if what == "resume":
            if not busy(self.d, data):
                spawn(self.d, data)
            return
        payload = build(self.d, self.cfg, what, data)
        key = key_of(what, int(payload["attempt"]), payload.get("rule"))
        if key in self.known:
            return  # queued before (a restarted watchdog, an event seen twice)
        self.known.add(key)
        channels = [i for i, c in enumerate(self.channels, 1) if what in c.on]
        folder(self.d)
        fd = os.open(payload_file(self.d, key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(payload, sort_keys=True) + "\n")
        append(self.d, {"key": key, "state": QUEUED, "what": what, "channels": channels})
        spawn(self.d, key)

    def _said_failed(self, item: Any, exc: Exception) -> None:
        from ..run.prepare import append_event

        try:
            append_event(self.d, "notify_failed", what=str(item[0]), channel=None,
                         reason=self.masker("cannot queue the notification: %s: %s" % (type(exc).__name__, exc)))
        except OSError:
            pass
