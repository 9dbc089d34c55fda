"""The watchdog's own records: its heartbeat file, its pulse to the supervisor, and events.jsonl.

Each survives a full disk: a heartbeat that cannot be written is tried again at the next beat,
events wait in memory, in order, until they can be appended.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..run.prepare import append_event
from ..wire import protocol as p
from ..wire.detector_list import finding_key

#: Events a full disk keeps waiting to be written (the oldest beyond are dropped).
MAX_PENDING = 1000


class Pulse:
    """A byte down stdout each heartbeat when stdout is the supervisor's pipe: how it tells a live
    watchdog from a frozen one without the disk (which may be full)."""

    def __init__(self) -> None:
        try:
            self.fd: Optional[int] = 1 if stat.S_ISFIFO(os.fstat(1).st_mode) else None
            if self.fd is not None:
                os.set_blocking(self.fd, False)  # a frozen supervisor never blocks the watchdog
        except OSError:
            self.fd = None

    def beat(self) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, b".")
        except BlockingIOError:
            pass
        except OSError:  # the supervisor is gone: nobody listens any more
            self.fd = None


class EventLog:
    """events.jsonl: the watchdog's decisions, one JSON object a line, appended (never rewritten)."""

    def __init__(self, d: str, listener: Optional[Callable[[str, Dict[str, Any]], None]] = None) -> None:
        self.path = os.path.join(d, p.EVENTS)
        self.listener = listener  # told of each event written (the notifier: agent/notify/outbox.py)
        self.reported: set = set()
        self.findings: set = set()  # (detector rule, gpu, its Xid or counter) reported
        self.counts: Dict[Optional[str], int] = {}  # a match's rule (None: unnamed)
        try:
            with open(self.path, "rb") as fh:
                for raw in fh:
                    try:
                        ev = json.loads(raw)
                    except ValueError:
                        continue
                    if isinstance(ev, dict) and ev.get("event") == "restart":  # what came before was another attempt
                        self.reported, self.findings, self.counts = set(), set(), {}
                    if isinstance(ev, dict) and ev.get("event") in ("match", "note") and ev.get("figures") is not None:
                        self.findings.add(finding_key(ev.get("rule"), ev.get("figures")))
                    if isinstance(ev, dict) and ev.get("event") == "match":
                        self.reported.add((ev.get("rule"), ev.get("offset")))
                        self.counts[ev.get("rule")] = self.counts.get(ev.get("rule"), 0) + 1
        except OSError:
            pass
        self.d = d
        self.pending: List[Tuple[str, Dict[str, Any]]] = []
        self.lock = threading.Lock()  # the abort sequence's thread writes too

    def write(self, event: str, **data: Any) -> None:
        """Append the event; one that cannot be written (a full disk) waits, in order, for the next try."""
        with self.lock:
            self.pending.append((event, data))
        self.flush()
        if self.listener is not None:
            self.listener(event, data)

    def flush(self) -> None:
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        while self.pending:
            event, data = self.pending[0]
            try:
                append_event(self.d, event, **data)
            except OSError:
                del self.pending[:-MAX_PENDING]
                return
            self.pending.pop(0)
