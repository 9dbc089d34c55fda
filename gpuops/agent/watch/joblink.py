"""A watchdog's side of a torchrun job (watch.json `job`): tell the other nodes this node ended, and end
this node when another did, also with nobody attached.

torchrun ends the other nodes by itself when node 0's agent goes (its rendezvous store goes with it)
or when a worker's collective fails against a dead peer; it does not when a node's process lives on
after a fatal line (the FX race), or when the others wait in a collective longer than its timeout.
So each node's watchdog appends its end to the attempt's end key in torchrun's own store the moment
it decides (the first end there, signed for this attempt, is the job's cause) and waits on it; the
link process (run/jobstore.py) does the store I/O with the training's torch. When the store goes
before anyone ended the job (node 0's torchrun killed before the others joined: nothing of the engine
ends them until its 600 s join timeout) and stays gone through the link's grace, the node ends as
the job's end, named after node 0. Before a stalled job's signal it exchanges this node's summary with the
other nodes' (`gather`: where the job hung, run/before_signal.py), and it carries the nodes' throughput
figures for the slow-node detector (`Peers`). Without a job the link does nothing and costs nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from .. import SH
from ..wire import jobwire
from ..wire import protocol as p
from ..wire.records import command_exit_code, read_text, write_json_atomic
from ..wire.watchfile import Job

#: How long an abort waits for the other nodes to have read this node's end before it signals (node 0's store dies
#: with it): the link waits jobwire.SETTLE for them, this a little more for the link.
SETTLE = jobwire.SETTLE + 0.5
#: How long a node whose training exited non-zero waits for the first failing node's end.
FAILED_WAIT = 3.0
#: How long a node (not node 0) waits, before its restart, for node 0's old store to go (its abort's grace and more).
STORE_GONE_WAIT = 120.0
#: gpuops exit codes by how the first node ended (the job's code).
_CODES = {"match": p.ExitCode.ABORTED, "stall": p.ExitCode.STALLED, p.RESTART_FAILED: p.ExitCode.TRAINING_FAILED}


class JobLink:
    def __init__(self, wd: Any) -> None:
        self.wd = wd
        self.job = wd.cfg.job or Job()  # watch.json `job` (none: not a node of a torchrun job)
        self.proc: Optional[subprocess.Popen] = None
        self.buf = b""
        self.end: Optional[Dict[str, Any]] = None  # the job's end, as the store has it
        self.ended = threading.Event()
        self.settled = threading.Event()  # this node's end is the job's and the others read it, or it is not ours
        self.published = False
        self.started = False
        self.forged_said = False
        self.write_lock = threading.Lock()  # the aborter's thread and the main one both write to the link
        self.summaries: Dict[int, Dict[str, Any]] = {}  # node rank -> its summary, once a stalled job gathers
        self.gathered = threading.Event()
        self.figures: Dict[str, Tuple[float, float]] = {}  # node name -> (its latest throughput figure, when)
        self.connected = False  # the link reached the store (before that, nothing is handed to it but the end)

    @property
    def active(self) -> bool:
        return self.wd.cfg.job is not None

    def start(self) -> None:
        if not self.active or self.proc is not None:
            return
        err = open(os.path.join(self.wd.d, p.JOB_LINK_LOG), "ab")
        try:
            proc = subprocess.Popen(["bash", os.path.join(SH, "job_store.sh"), self.wd.run_id], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, start_new_session=True, close_fds=True)
        finally:
            err.close()
        self.proc = proc
        assert proc.stdout is not None  # stdout=PIPE
        os.set_blocking(proc.stdout.fileno(), False)

    def fds(self) -> List[int]:
        """What the watchdog's wait also waits on; asked before each wait, it starts the link on the first
        and reads what the link said since the last (so a message wakes the wait, and is acted on after it)."""
        if not self.started:
            self.started = True
            self.start()
        self.pump()
        return self.links()

    def links(self) -> List[int]:
        return [self.proc.stdout.fileno()] if self.proc is not None and self.proc.stdout is not None else []

    def pump(self) -> None:
        """Read what the link said (never blocks)."""
        if self.proc is None or self.proc.stdout is None:
            return
        try:
            data = os.read(self.proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.proc.stdout.close()
            self.proc.stdout = None
            self.settled.set()
            self.gathered.set()  # nothing more will come
            return
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for raw in lines:
            msg = jobwire.parse(raw)
            if msg is not None:
                self.on_message(msg)

    def on_message(self, msg: Dict[str, Any]) -> None:
        kind = msg["kind"]
        if kind == "end" and self.end is None:
            self.end = dict(msg.get("record") or {})
            write_json_atomic(os.path.join(self.wd.d, p.JOB_END), self.end)
            self.ended.set()
            if self.end.get("node") != self.job.node_name:
                self.settled.set()
                self.wd.events.write("job_abort", **_said(self.end))
                self.wd.abort(p.JOB_ABORT, **_said(self.end))
        elif kind == "settled":
            self.settled.set()
        elif kind == "summary" and isinstance(msg.get("rank"), int) and isinstance(msg.get("summary"), dict):
            self.summaries[msg["rank"]] = msg["summary"]
        elif kind == "gathered":
            if msg.get("why"):
                self.wd.events.write("job_link", state="lost", message=str(msg["why"]))
            self.gathered.set()
        elif kind == "figures" and isinstance(msg.get("figures"), dict):
            for row in msg["figures"].values():
                if isinstance(row, dict) and isinstance(row.get("figure"), (int, float)):
                    self.figures[str(row.get("node"))] = (float(row["figure"]), float(row.get("time") or 0.0))
        elif kind == "gone":
            self.settled.set()
            self.wd.events.write("job_link", state=kind, message=str(msg.get("why")))
            self.store_gone()
        elif kind in ("connected", "lost", "forged") and not (kind == "forged" and self.forged_said):
            self.connected = self.connected or kind == "connected"
            if kind == "lost":
                self.settled.set()  # nothing to wait for
            self.forged_said = self.forged_said or kind == "forged"  # said once; the link says it once too
            words = {"connected": "connected to the job's rendezvous store (%s)" % msg.get("key")}
            self.wd.events.write("job_link", state=kind, message=words.get(kind) or str(msg.get("why")))

    def store_gone(self) -> None:
        """The store went before anyone set the job's end, and stayed gone through the link's grace: node 0's
        torchrun (the store's host) ended without a word, so this attempt is over on every node. A node that
        ended by itself (it published, or its training exited) has its own record: it is left as it is."""
        if self.end is not None or self.published or os.path.exists(os.path.join(self.wd.d, p.EXIT_CODE)):
            return
        nodes = list(self.job.nodes) or [None]
        self.end = {"node": nodes[0], "node_rank": 0, "reason": p.RESTART_FAILED, "rule": p.RESTART_FAILED,
                    "by": jobwire.STORE_GONE, "exit_code": p.ExitCode.TRAINING_FAILED,
                    "excerpt": "node %s's rendezvous store went away before the job's end and did not come back "
                               "within %gs" % (nodes[0], jobwire.STORE_GRACE)}
        self.ended.set()
        self.wd.events.write("job_abort", **_said(self.end))
        self.wd.abort(p.JOB_ABORT, **_said(self.end))

    def publish(self, reason: str, settle: bool = False, **why: Any) -> None:
        """This node ended the job (its own abort, a stop, its training failing): the first end in the store wins."""
        if not self.active or self.published or reason == p.JOB_ABORT or self.proc is None:
            return
        self.published = True
        record = {"node": self.job.node_name, "node_rank": self.job.node_rank, "reason": reason,
                  "rule": why.get("rule") if reason == "match" else reason, "by": why.get("by", "watchdog"),
                  "excerpt": (why.get("excerpt") or "")[-2000:] or None, "exit_code": _CODES.get(reason),
                  "time": round(time.time(), 3), "attempt": self.wd.attempt["attempt"]}
        if not self.tell(jobwire.line("publish", record=record)):
            return
        if settle:
            self.settle()

    def tell(self, line: bytes) -> bool:
        """One line to the link (whole, whichever thread writes); False where the link is gone."""
        with self.write_lock:
            try:
                assert self.proc is not None and self.proc.stdin is not None
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (OSError, ValueError, AssertionError):
                return False
        return True

    def gather(self, summary: Dict[str, Any], wait: float = jobwire.GATHER_WAIT) -> Dict[int, Dict[str, Any]]:
        """Every node's summary before a stalled job's signal (this node's put in the store, the others' read from
        it, each verified), bounded by `wait`; only this node's where the link is gone. Called by the abort's
        thread; the watchdog's own loop reads what the link says meanwhile."""
        mine = {self.job.node_rank: summary}
        if not self.active or self.proc is None or self.proc.stdout is None:
            return mine
        self.summaries = dict(mine)
        self.gathered.clear()
        if not self.tell(jobwire.line("summary", summary=summary, wait=wait)):
            return mine
        self.gathered.wait(wait + 3.0)
        return dict(self.summaries)

    def peers(self) -> Optional["Peers"]:
        """What the slow-node detector shares its figures through (None: no job)."""
        return Peers(self) if self.active else None

    def settle(self, seconds: float = SETTLE) -> None:
        """Give the other nodes a moment to read this node's end before this node's torchrun (maybe the store's
        host) is stopped."""
        if self.published:
            self.settled.wait(seconds)

    def at_end(self) -> None:
        """The training ended with no abort: a failure ends the job; wait for the first failing node's word."""
        if not self.active or os.path.exists(os.path.join(self.wd.d, p.ABORT)):
            return
        code = command_exit_code(read_text(os.path.join(self.wd.d, p.EXIT_CODE)))
        if code in (None, 0):
            return
        self.publish(p.RESTART_FAILED)
        deadline = time.monotonic() + FAILED_WAIT
        while self.end is None and time.monotonic() < deadline and self.links():
            time.sleep(0.05)
            self.pump()

    def close(self, store_gone: bool = False) -> None:
        """End the link; `store_gone` (a restart follows): first wait until this attempt's store is gone, so
        the next attempt never joins the old rendezvous while node 0's old torchrun still hosts it."""
        if self.proc is None:
            return
        if store_gone and self.job.node_rank != 0:
            deadline = time.monotonic() + STORE_GONE_WAIT
            while self.links() and time.monotonic() < deadline:
                time.sleep(0.05)
                self.pump()
                if int(time.monotonic() * 20) % 20 == 0:
                    self.wd.pulse.beat()  # alive to its supervisor while it waits (about once a second)
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self.proc = None


class Peers:
    """A node's throughput figures, shared with the other nodes of the job through the link (judge.Run.peers)."""

    def __init__(self, link: JobLink) -> None:
        self.link = link
        self.node = link.job.node_name

    def share(self, t: float, figure: float) -> None:
        """This node's figure (the link sets it in the store, signed, and answers with the others' latest)."""
        if self.link.proc is not None and self.link.connected:
            self.link.tell(jobwire.line("figure", figure=figure, time=t))

    def figures(self) -> Dict[str, Tuple[float, float]]:
        """node name -> (its latest figure, when), as the other nodes shared them."""
        return dict(self.link.figures)


def _said(end: Dict[str, Any]) -> Dict[str, Any]:
    """abort.json's fields for a node ended by the job: who ended it first, how, and the rule to restart after."""
    return {"first_node": end.get("node"), "first_rank": end.get("node_rank"), "first_reason": end.get("reason"),
            "first_by": end.get("by"), "rule": end.get("rule") if end.get("by") not in ("stop", "timeout") else None,
            "excerpt": end.get("excerpt"), "exit_code": end.get("exit_code")}
