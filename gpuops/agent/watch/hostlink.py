"""`python3 -m gpuops_agent host-link RUN_ID`, beside the run (inside its container): the end of the host's
kernel-log follower (watch/hostwatch.py) that writes into the run directory.

It reads JSON lines on stdin and appends each record of a known kind (wire/hostwire.KINDS, at most MAX_RECORD
bytes) to the run's host-xids.jsonl, the one record kind it writes; the watchdog is woken by the file's change
and judges each Xid (detect/gpu_xid.py). It ends, and with it the host's follower (whose pipe it was), when
the run is over (the watchdog says done, or the watchdog's supervisor is gone), when the run directory is gone,
or when its stdin closes (the follower died); its last record says why.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import Any, Dict, List, Optional

from ..system.procs import running
from ..wire import protocol as p
from ..wire.hostwire import HOST_LOG, KINDS, MAX_RECORD
from ..wire.records import read_json, read_text

#: The file stops growing here (an Xid storm on a run's GPUs): one `error` record says so.
MAX_FILE = 1 << 20


def over(d: str) -> Optional[str]:
    """Why the run no longer needs the host's kernel log (None while it lives)."""
    if not os.path.isdir(d):
        return "the run directory is gone"
    if (read_json(os.path.join(d, p.WATCHDOG)) or {}).get("state") == "done":
        return "the run ended"
    pid = (read_text(os.path.join(d, p.SUPERVISOR_PID), 64) or "").strip()
    if not pid.isdigit() or not running(int(pid)):
        return "the run's watchdog is gone"
    return None


class Link:
    def __init__(self, d: str) -> None:
        self.d = d
        self.path = os.path.join(d, HOST_LOG)
        self.full = False

    def append(self, record: Dict[str, Any]) -> None:
        line = json.dumps(p.versioned({**record, "ts": round(time.time(), 3)}), sort_keys=True,
                          separators=(",", ":")) + "\n"
        try:
            size = os.path.getsize(self.path)
        except OSError:
            size = 0
        if size + len(line) > MAX_FILE:
            if self.full:
                return
            self.full = True
            line = json.dumps(p.versioned({"kind": "error", "ts": round(time.time(), 3), "message": "host-xids.jsonl "
                              "is full (%d bytes): later Xids are not recorded" % MAX_FILE})) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)

    def take(self, raw: bytes) -> None:
        """One line from the follower: kept when it is a record of a known kind."""
        if len(raw) > MAX_RECORD:
            return
        try:
            record = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            return
        if isinstance(record, dict) and record.get("kind") in KINDS and record.get("kind") != "ended":
            if record["kind"] == "following":
                record["link_pid"] = os.getpid()
            self.append(record)


def main(argv: List[str]) -> int:
    (run_id,) = argv
    d = p.run_dir(run_id)
    if not os.path.isdir(d):
        sys.stderr.write("host-link: no run directory %s\n" % d)
        return 1
    link = Link(d)
    fd = sys.stdin.fileno()
    buf, why = b"", None
    while why is None:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                why = "the host's follower ended"
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                if raw.strip():
                    link.take(raw)
        why = over(d)
    if os.path.isdir(d):
        link.append({"kind": "ended", "why": why})
    return 0


tool_host_link = main
