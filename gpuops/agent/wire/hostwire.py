"""What the host's kernel-log tools say, and the one record they leave in a run directory. Both sides read it here;
standard library only.

The tools run on the host (the Proxmox host of a container target, or the target itself):
- `xids WINDOW`: the Xids of the last WINDOW seconds: `@@gpuops kernel_log READER NOW` (or `kernel_log_refused
  WHY`), then `@@gpuops xid {json}` each (XidEvent.as_json);
- `host-watch` (a JSON spec on stdin: the run, its GPUs by bus, the command that reaches the run directory):
  `@@gpuops host-watch PID READER` once it follows the kernel log in the background, or `host-watch-off WHY`.
- `host-link RUN` (in the container, started by host-watch through that command): appends what host-watch
  hands it to the run's `host-xids.jsonl` (HOST_LOG), one JSON object a line, `kind` one of KINDS: `following`
  (first: the reader, the host's pid, the link's pid, the GPUs), `xid` (an Xid on a GPU of the run, with the
  catalog's words), `error` (the reader failed), `ended` (last: why the link ended).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .marks import marks
from .xid import XidEvent

__all__ = ["HOST_LOG", "HostLog", "HostWatchReply", "KINDS", "XidsReply", "parse_host_watch", "parse_xids",
           "read_host_log", "xid_of"]

HOST_LOG = "host-xids.jsonl"
KINDS = ("following", "xid", "error", "ended")
#: A record longer than this is not one of ours (the link refuses it).
MAX_RECORD = 16384


def xid_of(obj: Dict[str, Any]) -> Optional[XidEvent]:
    """An XidEvent back from its JSON (XidEvent.as_json, or a host-xids.jsonl `xid` record); None when garbled."""
    try:
        return XidEvent(str(obj["bus"]), int(obj["code"]), str(obj.get("message") or ""), str(obj.get("line") or ""),
                        obj.get("pid") if isinstance(obj.get("pid"), int) else None,
                        obj.get("process") if isinstance(obj.get("process"), str) else None,
                        float(obj["t"]) if isinstance(obj.get("t"), (int, float)) else None)
    except (KeyError, TypeError, ValueError):
        return None


def _object(text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class XidsReply:
    """`xids`' answer: the reader that worked (None: the kernel log could not be read, `why` says why), the host's
    clock when it read, and every Xid line it found."""

    reader: Optional[str] = None
    now: Optional[float] = None
    why: str = ""
    xids: List[XidEvent] = field(default_factory=list)

    @property
    def readable(self) -> bool:
        return self.reader is not None


def parse_xids(text: str) -> XidsReply:
    reply = XidsReply(why="the host's tool said nothing")
    for key, value in marks(text):
        if key == "kernel_log":
            reader, _, now = value.partition(" ")
            reply.reader, reply.why = reader, ""
            try:
                reply.now = float(now)
            except ValueError:
                reply.now = None
        elif key == "kernel_log_refused":
            reply.why = value.strip() or "the kernel log could not be read"
        elif key == "xid":
            event = xid_of(_object(value))
            if event is not None:
                reply.xids.append(event)
    return reply


@dataclass
class HostWatchReply:
    """`host-watch`'s answer: the follower's pid and reader on the host, or why it does not follow."""

    pid: Optional[int] = None
    reader: Optional[str] = None
    off: Optional[str] = None


def parse_host_watch(text: str) -> HostWatchReply:
    for key, value in marks(text):
        if key == "host-watch":
            pid, _, reader = value.partition(" ")
            return HostWatchReply(int(pid) if pid.isdigit() else None, reader.strip() or None)
        if key == "host-watch-off":
            return HostWatchReply(off=value.strip() or "the host's kernel log cannot be followed")
    return HostWatchReply(off="the host's tool said nothing: " + " ".join(text.split())[-300:])


@dataclass
class HostLog:
    """A run's host-xids.jsonl as read: the follower's first record, the Xids, its errors, its end; `size` the
    bytes read (where the next read starts)."""

    following: Optional[Dict[str, Any]] = None
    xids: List[Dict[str, Any]] = field(default_factory=list)
    errors: List[Dict[str, Any]] = field(default_factory=list)
    ended: Optional[Dict[str, Any]] = None
    size: int = 0

    def add(self, record: Dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "following" and self.following is None:
            self.following = record
        elif kind == "xid":
            self.xids.append(record)
        elif kind == "error":
            self.errors.append(record)
        elif kind == "ended":
            self.ended = record


def read_host_log(d: str, offset: int = 0, log: Optional[HostLog] = None) -> HostLog:
    """The records of a run's host-xids.jsonl from byte `offset` (complete lines only), added to `log`."""
    log = log if log is not None else HostLog()
    log.size = offset
    try:
        with open(os.path.join(d, HOST_LOG), "rb") as fh:
            fh.seek(offset)
            data = fh.read(1 << 20)
    except OSError:
        return log
    end = data.rfind(b"\n") + 1
    for line in data[:end].split(b"\n"):
        record = _object(line.decode("utf-8", "replace")) if line.strip() else {}
        if record:
            log.add(record)
    log.size = offset + end
    return log
