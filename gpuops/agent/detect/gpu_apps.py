"""The compute processes on each GPU of a run, from one long-lived nvidia-smi loop (the driver opened once).

nvidia-smi answers one query per call, so the count is a second process beside the sampler:
`nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader,nounits -lms N`, read without
blocking. It prints a row per process each interval and nothing when there is none (REFERENCE.md),
so a pass is the rows that arrive together (within GAP seconds of each other), and an interval
with no row while the loop runs is a pass that found no process. The GPUs' uuids come first from
one `--query-gpu=index,uuid` (the loop names GPUs by uuid).
"""

from __future__ import annotations

import os
import subprocess
from typing import IO, Callable, Dict, List, Optional

from ..system.procs import end_child

#: Rows closer together than this (seconds) are one pass of the loop.
GAP = 0.3
#: Seconds before a loop that died is started again.
RESTART_AFTER = 30.0


class ProcessLoop:
    """Counts per GPU, one pass every `every` seconds; `take()` gives each new pass once."""

    def __init__(self, gpus: List[int], every: float, preexec: Optional[Callable[[], None]] = None) -> None:
        self.gpus, self.every, self.preexec = gpus, max(0.1, every), preexec
        self.uuids: Dict[str, int] = {}
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.buf = b""
        self.rows: List[str] = []  # the pass being read
        self.last_row = self.since = 0.0
        self.fresh: Optional[Dict[int, int]] = None  # a pass not taken yet
        self.down_since: Optional[float] = None
        self.calls = 0

    def _spawn(self, argv: List[str], now: float) -> None:
        self.calls += 1
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, preexec_fn=self.preexec)
        except OSError:
            self.proc, self.down_since = None, now
            return
        os.set_blocking(self._out().fileno(), False)
        self.buf, self.rows, self.since = b"", [], now

    def start(self, now: float) -> None:
        """The uuid query first, then the loop (again RESTART_AFTER seconds after it died)."""
        if self.proc is not None or (self.down_since is not None and now - self.down_since < RESTART_AFTER):
            return
        if not self.uuids:
            self._spawn(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader,nounits"], now)
        else:
            self._spawn(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader,nounits",
                         "-lms", str(int(self.every * 1000))], now)

    def _out(self) -> IO[bytes]:
        assert self.proc is not None and self.proc.stdout is not None  # started with stdout=PIPE
        return self.proc.stdout

    def fds(self) -> List[int]:
        """Its pipe, to wait on beside the log."""
        return [self._out().fileno()] if self.proc is not None else []

    def poll(self, now: float) -> None:
        """Read what arrived; close a pass that is over; start (or restart) the query."""
        if self.proc is None:
            self.start(now)
            return
        try:
            chunk = self._out().read()
        except OSError:
            chunk = b""
        if chunk:
            *lines, self.buf = (self.buf + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    if self.uuids and self.rows and now - self.last_row > GAP:
                        self._close_pass()
                    self.rows.append(line.decode("utf-8", "replace"))
                    self.last_row = now
        if chunk == b"" or self.proc.poll() is not None:  # EOF: the query ended (the uuids), or the loop died
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:  # its pipe closed, yet it lingers
                self.proc.kill()
                self.proc.wait()
            ok = self.proc.returncode == 0
            self.proc = None
            if not self.uuids:
                self.uuids = {r[1]: int(r[0]) for r in self._split() if len(r) == 2 and r[0].isdigit()}
                self.rows = []
                self.down_since = None if ok and self.uuids else now
                self.start(now)
                return
            self.down_since = now
            return
        if self.rows and now - self.last_row > GAP:
            self._close_pass()
        elif not self.rows and now - max(self.last_row, self.since) > self.every * 1.5:
            self.last_row = now  # a whole interval and no row: a pass that found no process
            self._close_pass()

    def _split(self) -> List[List[str]]:
        return [[c.strip() for c in row.split(",")] for row in self.rows]

    def _close_pass(self) -> None:
        counts = dict.fromkeys(self.gpus, 0)
        for row in self._split():
            gpu = self.uuids.get(row[0]) if row else None
            if gpu in counts:
                counts[gpu] += 1
        self.rows, self.fresh = [], counts

    def take(self) -> Optional[Dict[int, int]]:
        """The counts of a pass not taken before (None when none came since)."""
        fresh, self.fresh = self.fresh, None
        return fresh

    def stop(self) -> None:
        end_child(self.proc)
        self.proc = None
