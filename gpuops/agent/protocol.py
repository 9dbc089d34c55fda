"""The wire protocol between gpuops and its target: paths, record names, markers and frames.

Both sides import this module (the client as ``gpuops.agent.protocol``, the target as
``gpuops_agent.protocol``), so a marker or a frame is spelled and parsed in one place.
The shell tools in ``sh/`` print markers too; tests/test_target_package.py checks that every
marker they print is one of ``MARKS``.
"""

from __future__ import annotations

import os
from typing import Iterator, List, Optional, Tuple

# -- where things live on the target (relative to the target user's $HOME) --------------------
STATE_DIR = ".gpuops"
RUNS = "runs"
SESSIONS = "sessions"
LOCKS = "locks"
LIB = "lib"
PACKAGE = "gpuops_agent"  # the name this package has on the target

# -- records in a run directory ----------------------------------------------------------------
LOG = "log"
EXIT_CODE = "exit_code"  # the command's exit status once it ended (128+N for signal N)
META = "meta.json"  # what was launched: playbook, command, env (secrets masked), GPUs, phase
ENV = "env.sh"  # the exports of the playbook's env (mode 0600: it holds the secret values)
COMMAND = "command"  # the training command, as the playbook writes it
WORKDIR = "workdir"  # where warmup and training run, as run.sh resolves it
WATCH = "watch.json"  # the rules, stall timeout, detectors and abort settings the run was launched with
ABORT = "abort.json"  # why the run was stopped and by whom; created once (the claim), never replaced
ABORT_SIGNALLED = "abort-signalled"  # when the abort's signal went to the run: it is never sent twice
ABORT_DONE = "abort-done.json"  # the abort sequence finished: survivors, GPUs, seconds
EVENTS = "events.jsonl"  # the watchdog's decisions, append-only, one JSON object a line
WATCHDOG = "watchdog.json"  # the watchdog's heartbeat and resume point, rewritten every second
WATCHDOG_LOG = "watchdog.err"  # the supervisor's and watchdog's own stderr
SUPERVISOR_PID = "supervisor.pid"
WATCHDOG_LOCK = "watchdog.lock"  # flock'ed by the one watchdog of the run
CACHE_SNAPSHOT = "cache-snapshot.txt"  # the inductor cache's files when training started
STARTED = "started"  # written once training's tmux session exists: from then on a missing session means it ended
PROFILE = "profile.json"  # the run's steady figures, written when it ends
SAMPLES = "samples.jsonl"  # recent raw GPU/throughput samples, one JSON object a line
SAMPLES_COARSE = "samples-coarse.jsonl"  # older samples as per-bucket min/median/max

#: A watchdog whose heartbeat is older than this is taken for gone: clients watch the run themselves.
HEARTBEAT_STALE = 10.0
#: Seconds between watchdog heartbeats.
HEARTBEAT_EVERY = 1.0

# -- markers: lines the target tools print for the client to read ------------------------------
MARK = "@@gpuops "
MARKS = frozenset({
    # bootstrap
    "need-lib",
    # probe.sh
    "now", "gpus", "gpus_rc", "apps", "apps_rc", "nosmi", "notmux", "nopython", "python", "session", "alive",
    "locked", "run", "meta", "exit", "abort", "abort_done", "log", "watchdog", "watchdog_pid", "samples", "samples_end",
    "pct_exec_rc", "pct_rc",
    # lock.sh
    "busy", "stale", "gpu-held", "locked-ok",
    # kill_marked.sh, abort, start, warmup.sh
    "killed", "survivors", "session-gone", "gpus-after", "stopped", "session-exists", "started", "watchdog-failed",
    "aborted", "already", "claimed", "prepared", "recorded",
})
#: Exit status of a command that found gpuops' target files missing (the client installs them, then retries).
NEED_LIB_EXIT = 97
#: Exit status of warmup.sh / start when `gpuops stop` ended the launch before training started.
STOPPED_EXIT = 86


def mark(key: str, value: str = "") -> str:
    """One marker line (without its newline)."""
    assert key in MARKS, key
    return MARK + key + (" " + value if value else "")


def marks(text: str) -> Iterator[Tuple[str, str]]:
    """(key, value) of every marker line in text, in order."""
    for line in text.splitlines():
        if line.startswith(MARK):
            key, _, value = line[len(MARK):].partition(" ")
            yield key, value


def state_dir(home: Optional[str] = None) -> str:
    return os.path.join(home or os.path.expanduser("~"), STATE_DIR)


def check_run_id(run_id: str) -> str:
    """Run ids hold only [0-9a-z-] (they name folders and travel in shell words)."""
    if not run_id or len(run_id) > 64 or any(c not in "0123456789abcdefghijklmnopqrstuvwxyz-" for c in run_id):
        raise ValueError("not a run id: %r" % (run_id,))
    return run_id


def run_dir(run_id: str, home: Optional[str] = None) -> str:
    return os.path.join(state_dir(home), RUNS, check_run_id(run_id))


# -- the follower's frames ----------------------------------------------------------------------
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
