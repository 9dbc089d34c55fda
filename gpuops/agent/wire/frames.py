"""The follower's frames: built and parsed here only (imported through ``protocol``)."""

from __future__ import annotations

from typing import List, Optional, Tuple

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


Frame = Tuple[bytes, tuple]


class FrameReader:
    """Incremental parser of the follower's output: feed chunks of any size, get (kind, fields)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.noise: List[str] = []  # lines that are no frame (a shell's error message), the last few

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
                    out.append((kind, (int(head[1]), int(head[2]), data)))
                else:
                    out.append((kind, (int(head[1]), data)))
                continue
            del self.buf[: nl + 1]
            if kind == FRAME_HEARTBEAT:
                wd = (float(head[4]), int(head[5]), head[6].decode()) if len(head) >= 7 else (-1.0, -1, "-")
                out.append((kind, (float(head[1]), int(head[2]), float(head[3])) + wd))
            elif kind == FRAME_END:
                code = head[2] if len(head) > 2 else b"-"
                out.append((kind, (head[1].decode(), int(code) if code.lstrip(b"-").isdigit() else None)))
            elif kind in (FRAME_TRUNCATED, FRAME_ROTATED):
                out.append((kind, ()))
            else:
                self.noise = (self.noise + [b" ".join(head).decode("utf-8", "replace")])[-5:]
        return out
