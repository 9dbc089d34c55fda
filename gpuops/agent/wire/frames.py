"""The follower's frames: built and parsed here only (imported through ``protocol``); each frame read back is
one typed value, the same for every reader (Data, Heartbeat, WatchdogEvent, Ended, Reset)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

# D <inode> <offset> <len>\n<bytes>   log bytes at offset
# W <offset> <len>\n<bytes>           bytes of the watchdog's events file at offset
# T <inode>                           the log was truncated: what follows starts at 0
# R                                   the log was replaced (rotated): a new file from 0
# H <now> <size> <mtime> <wd_age> <wd_offset> <wd_state>
#                                     heartbeat (every second): the log's size (-1 unknown,
#                                     -2 missing) and mtime; the watchdog's heartbeat age in
#                                     seconds (-1: none), the log offset it has matched up
#                                     to, and its state (watching, aborting, done, or -)
# E <how> <code>                      the run ended (exit, abort, gone, once) and all was sent

FRAME_DATA, FRAME_EVENTS, FRAME_TRUNCATED, FRAME_ROTATED, FRAME_HEARTBEAT, FRAME_END = b"D", b"W", b"T", b"R", b"H", b"E"


def data_frame(inode: int, offset: int, data: bytes) -> bytes:
    return b"D %d %d %d\n" % (inode, offset, len(data)) + data


def events_frame(offset: int, data: bytes) -> bytes:
    return b"W %d %d\n" % (offset, len(data)) + data


def truncated_frame(inode: int) -> bytes:
    return b"T %d\n" % inode


def rotated_frame() -> bytes:
    return b"R\n"


def heartbeat_frame(now: float, size: int, mtime: float, wd_age: float, wd_offset: int, wd_state: str) -> bytes:
    return b"H %.3f %d %.3f %.3f %d %s\n" % (now, size, mtime, wd_age, wd_offset, (wd_state or "-").encode())


def end_frame(how: str, code: Optional[int]) -> bytes:
    return ("E %s %s\n" % (how, "-" if code is None else code)).encode()


@dataclass
class Data:
    """Log bytes at `offset` of the file with `inode`."""

    inode: int
    offset: int
    data: bytes


@dataclass
class Heartbeat:
    now: float
    size: int
    mtime: float
    watchdog_age: float = -1.0  # seconds since the watchdog's heartbeat; -1: it never wrote one
    watchdog_offset: int = -1  # the log offset it has matched up to
    watchdog_state: str = "-"  # watching | aborting | done


@dataclass
class WatchdogEvent:
    """One line of the watchdog's events.jsonl (a match, an abort, a restart ...) and where it ends."""

    offset: int
    record: Dict[str, Any]
    end: int


@dataclass
class Ended:
    how: str  # exit | abort | gone | once | container-stopped | container-missing
    code: Optional[int]


@dataclass
class Reset:
    """The log was truncated or replaced: what follows starts at offset 0 of the new file."""

    why: str  # truncated | rotated


Frame = Union[Data, Heartbeat, WatchdogEvent, Ended, Reset]


class FrameReader:
    """Incremental parser of the follower's output: feed chunks of any size, get its frames as values."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.said: List[str] = []  # lines that are no frame (a shell's error message), the last few

    @property
    def noise(self) -> str:
        """What came that was no frame (a shell's complaint), for an error message."""
        return " | ".join(self.said)[-300:]

    def feed(self, chunk: bytes) -> List[Frame]:
        self.buf += chunk
        out: List[Frame] = []
        while True:
            nl = self.buf.find(b"\n")
            if nl < 0:
                return out
            head = bytes(self.buf[:nl]).split(b" ")
            kind = head[0]
            if kind in (FRAME_DATA, FRAME_EVENTS):
                length = int(head[-1])
                if len(self.buf) < nl + 1 + length:
                    return out
                data = bytes(self.buf[nl + 1: nl + 1 + length])
                del self.buf[: nl + 1 + length]
                if kind == FRAME_DATA:
                    out.append(Data(int(head[1]), int(head[2]), data))
                else:
                    out += _events(int(head[1]), data)
                continue
            del self.buf[: nl + 1]
            if kind == FRAME_HEARTBEAT:
                wd = (float(head[4]), int(head[5]), head[6].decode()) if len(head) >= 7 else (-1.0, -1, "-")
                out.append(Heartbeat(float(head[1]), int(head[2]), float(head[3]), *wd))
            elif kind == FRAME_END:
                code = head[2] if len(head) > 2 else b"-"
                out.append(Ended(head[1].decode(), int(code) if code.lstrip(b"-").isdigit() else None))
            elif kind == FRAME_TRUNCATED:
                out.append(Reset("truncated"))
            elif kind == FRAME_ROTATED:
                out.append(Reset("rotated"))
            else:
                self.said = (self.said + [b" ".join(head).decode("utf-8", "replace")])[-5:]


def _events(offset: int, data: bytes) -> List[Frame]:
    """The watchdog's events in a W frame, one per JSON line (a line that is no object is skipped)."""
    out: List[Frame] = []
    for line in data.splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            out.append(WatchdogEvent(offset, record, offset + len(line)))
        offset += len(line)
    return out
