"""`python3 -m gpuops_agent host-watch`, run on the host by a launch: follow the host's kernel log for the run's
GPUs while the run lives, and hand each Xid on one of them to the run's watchdog within a second or two.

The spec comes as one JSON line on stdin: `run`, `window` (seconds back from now to read first: the launch so
far), `gpus` (the kernel log's bus, e.g. `0000:9a:00`, -> the GPU's index, bus id and UUID as the run's side
sees it) and `link`, the command that runs `host-link RUN` beside the run: `pct exec CTID -- ...` for a
container (through the container's own root, as root inside it: the container's user namespace decides what
it may write, the host never opens a path the container controls), the tool itself for a target that is the
host. It answers at once (its `host-watch` mark: PID READER; or `host-watch-off` WHY where the kernel log cannot
be read: wire/hostwire.py) and goes on in the background: its own session, no terminal, nothing written on the host.

It ends with the run: the link ends when the run does (the watchdog's records say it), and a link that ended
closes the pipe this process reads (an exited link is seen within a second); the reader (`journalctl -f` or
`dmesg --follow`) dies with it (PR_SET_PDEATHSIG). If this process dies, the link's stdin closes and the link
ends too. It only reads the kernel log; the link writes one record kind into the run directory.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ..system import kernlog
from ..system.procs import die_with_parent
from ..wire.marks import mark
from ..wire.xid import parse_line

#: Reader restarts before the follower gives up (it says so through the link).
MAX_RESTARTS = 5


def main(argv: List[str]) -> int:
    try:
        spec = json.loads(sys.stdin.readline() or "{}")
        gpus: Dict[str, Dict[str, Any]] = {str(k): dict(v) for k, v in (spec.get("gpus") or {}).items()}
        link = [str(x) for x in spec["link"]]
        window = float(spec.get("window") or 0.0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        print(mark("host-watch-off", "a bad spec (%s)" % exc))
        return 2
    reader, why = kernlog.pick()
    if reader is None:
        print(mark("host-watch-off", why))
        return 0
    if not gpus:
        print(mark("host-watch-off", "the run's GPUs have no bus id to follow"))
        return 0
    since = time.time() - max(window, 0.0)
    pid = _daemonize()
    if pid is not None:  # the caller's side: the follower runs
        print(mark("host-watch", "%d %s" % (pid, reader.name)))
        sys.stdout.flush()
        return 0
    try:
        Follower(reader, gpus, link, since).run()
    finally:
        os._exit(0)


def _daemonize() -> Optional[int]:
    """Fork twice: the caller gets the follower's pid (None in the follower, in its own session, with its stdio
    on /dev/null so the command that started it ends)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(w)
        got = b""
        while True:
            chunk = os.read(r, 64)
            if not chunk:
                break
            got += chunk
        os.close(r)
        os.waitpid(pid, 0)
        return int(got or b"0")
    os.close(r)
    os.setsid()
    grand = os.fork()
    if grand > 0:
        os.write(w, b"%d" % grand)
        os._exit(0)
    os.close(w)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.chdir("/")
    return None


class Follower:
    """The kernel log -> the link, for one run."""

    def __init__(self, reader: kernlog.Reader, gpus: Dict[str, Dict[str, Any]], link: List[str], since: float) -> None:
        self.reader, self.gpus, self.since = reader, gpus, since
        self.link = subprocess.Popen(link, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     close_fds=True)
        self.proc: Optional[subprocess.Popen] = None
        self.buf = b""
        self.seen: Set[Tuple[Any, ...]] = set()
        self.last_t = since

    def send(self, record: Dict[str, Any]) -> bool:
        try:
            assert self.link.stdin is not None
            self.link.stdin.write(json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n")
            self.link.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def start_reader(self) -> None:
        self.proc = subprocess.Popen(self.reader.follow_argv(self.last_t), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.buf = b""

    def run(self) -> None:
        import socket

        if not self.send({"kind": "following", "reader": self.reader.name, "host_pid": os.getpid(),
                          "host": socket.gethostname(), "since": round(self.since, 3),
                          "gpus": sorted(int(g["index"]) for g in self.gpus.values())}):
            return
        restarts = 0
        self.start_reader()
        try:
            while True:
                assert self.proc is not None and self.proc.stdout is not None and self.link.stdout is not None
                ready, _, _ = select.select([self.proc.stdout, self.link.stdout], [], [], 1.0)
                if self.link.stdout in ready and not os.read(self.link.stdout.fileno(), 4096):
                    return  # the link ended: the run is over
                if self.link.poll() is not None:
                    return
                if self.proc.stdout in ready:
                    data = os.read(self.proc.stdout.fileno(), 65536)
                    if data:
                        if not self.feed(data):
                            return
                        continue
                if self.proc.poll() is not None or self.proc.stdout in ready:
                    restarts += 1
                    if restarts > MAX_RESTARTS:
                        self.send({"kind": "error", "message": "%s stopped %d times; the host's kernel log is no longer "
                                   "followed" % (self.reader.name, restarts - 1)})
                        return
                    time.sleep(1.0)
                    self.start_reader()
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            try:
                assert self.link.stdin is not None
                self.link.stdin.close()
            except OSError:
                pass
            try:
                self.link.wait(10)
            except subprocess.TimeoutExpired:
                self.link.kill()

    def feed(self, data: bytes) -> bool:
        """Complete lines of the reader's output; an Xid on one of the run's GPUs goes to the link."""
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for raw in lines:
            t, text = kernlog.parse_stamp(raw.decode("utf-8", "replace"))
            event = parse_line(text, t)
            if event is None or event.bus not in self.gpus or (t is not None and t < self.since):
                continue
            key = (event.t, event.bus, event.code, event.message)
            if key in self.seen:
                continue  # a restarted reader says the log again
            self.seen.add(key)
            self.last_t = max(self.last_t, t or self.last_t)
            gpu = self.gpus[event.bus]
            record = {"kind": "xid", **event.as_json(), "index": gpu.get("index"), "bus_id": gpu.get("bus_id"),
                      "uuid": gpu.get("uuid")}
            if not self.send(record):
                return False
        return True
