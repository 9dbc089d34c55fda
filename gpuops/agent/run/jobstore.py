"""The job link: one process per node of a torchrun job, beside its watchdog, holding torchrun's rendezvous store.

`python3 -m gpuops_agent job-store RUN_ID`, started by the watchdog through sh/job_store.sh with the
training's environment, because it needs the training's torch: the store is torchrun's own c10d
TCPStore on node 0 (the port torchrun opened; gpuops opens none). It waits on this attempt's end
slots (wire/jobwire.py) one after another and tells the watchdog (one JSON line on stdout) when a
slot holds a node's end; a line from the watchdog on stdin asks it to put this node's end into the
first free slot. A slot that does not verify (forged, replayed) is said once, then skipped: each
costs one read, never a loop, and past MAX_SLOTS of them the link stops reading.

Before a stalled job's signal the watchdog hands it this node's summary (`summary`): the link puts it under
jobwire.summary_key, signed, reads every other node's there (waiting up to jobwire.GATHER_WAIT) and says each
that verifies, then `gathered`. A `figure` (this node's throughput, for the slow-node detector) is set under
jobwire.figure_key, and the other nodes' latest verified figures are said back (`figures`): one set and one read
a node per figure shared, no loop of its own.

The store going away before the job's end (node 0's torchrun killed, its host gone) is said as
`gone` once jobwire.STORE_GRACE seconds passed without the same store answering again: the watchdog
then ends this node as the job's end. Its mark (jobwire.mark_key) tells the same store from a new
one that node 0's next attempt opened on the port.
"""

from __future__ import annotations

import importlib
import os
import secrets
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Dict, Optional

from ..wire import jobwire, watchfile
from ..wire import protocol as p
from ..wire.records import read_text

#: How long to keep trying to reach the store: torchrun's own rendezvous join timeout (600 s).
CONNECT_FOR = 600.0
WAIT_SLICE = 30.0
#: How many slots that hold no end of this attempt a link reads before it stops reading (its cost's bound).
MAX_SLOTS = 64


def _say(kind: str, **data: Any) -> None:
    sys.stdout.buffer.write(jobwire.line(kind, **data))
    sys.stdout.buffer.flush()


def _value(raw: Any) -> bytes:
    return raw if isinstance(raw, bytes) else str(raw).encode()


class Link:
    def __init__(self, dist: Any, host: str, port: int, key: str, at: jobwire.Attempt, rank: int) -> None:
        self.dist, self.host, self.port, self.key, self.at = dist, host, port, key, at
        self.mark = jobwire.mark_key(at.rdzv, rank)
        self.nonce = secrets.token_hex(16)
        self.waiter: Any = None
        self.setter: Any = None
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.rank = rank
        self.next = 1  # the first slot not judged yet (every one before it holds no end of this attempt)
        self.end_slot = 0  # where the job's end is, once read
        self.refused_said = False
        self.figures_client: Any = None

    def client(self, seconds: float) -> Any:
        return self.dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=seconds),
                                  wait_for_workers=False)

    def connect(self, deadline: float) -> None:
        """Two clients of node 0's store (one waits, one writes), once torchrun there has opened it; the mark left."""
        while True:
            try:
                self.waiter, self.setter = self.client(WAIT_SLICE), self.client(WAIT_SLICE)
                break
            except (RuntimeError, OSError, TimeoutError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
        self.setter.set(self.mark, self.nonce)

    def regain(self) -> bool:
        """After the store stopped answering: the same store back within the grace (a dropped connection)? A
        store that answers without this link's mark is another one (node 0's next attempt): no, at once."""
        deadline = time.monotonic() + jobwire.STORE_GRACE
        while time.monotonic() < deadline:
            try:
                waiter = self.client(max(0.5, min(deadline - time.monotonic(), 5.0)))
                if not waiter.check([self.mark]) or _value(waiter.get(self.mark)) != self.nonce.encode():
                    return False
                self.waiter, self.setter = waiter, self.client(WAIT_SLICE)
                return True
            except Exception:  # noqa: BLE001 - nothing answers (yet), or it went while asked
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        return False

    def judge(self, slot: int, raw: Any) -> None:
        """What slot n holds, once it is the next to judge: this attempt's end ends the wait; anything else is
        said once (then skipped without a word) and the next slot is waited on."""
        with self.lock:
            if self.done.is_set() or slot != self.next:
                return
            record, why = jobwire.check(self.key, _value(raw).decode("utf-8", "replace"), self.at)
            if record is not None:
                self.end_slot = slot
                self.done.set()
                _say("end", record=record)
                return
            self.next += 1
            if not self.refused_said:
                self.refused_said = True
                _say("forged", why="a value under %s was ignored: %s (any other such value is ignored without a "
                                   "word)" % (jobwire.store_key(self.at.rdzv, slot), why))

    def publish(self, record: Dict[str, Any]) -> None:
        """This node's end into the first free slot (compare-and-set: a slot someone wrote first is passed over)."""
        sealed = jobwire.seal(self.key, record, self.at)
        slot = self.next
        try:
            while not self.done.is_set() and slot <= MAX_SLOTS:
                held = _value(self.setter.compare_set(jobwire.store_key(self.at.rdzv, slot), "", sealed))
                self.judge(slot, held)
                if held == sealed.encode():  # ours is in: the job's end is the first slot that verifies
                    if self.end_slot == slot:
                        self.settle()
                    return
                slot += 1
        except Exception as exc:  # noqa: BLE001
            _say("lost", why="cannot set the job's end in the store: %s" % exc)
            return
        if not self.done.is_set():
            _say("lost", why="no free slot for this node's end among the first %d under %s" % (
                MAX_SLOTS, jobwire.store_key(self.at.rdzv)))

    def settle(self) -> None:
        """This node's end is the job's: wait (jobwire.SETTLE at most) until every other node has read it, so that
        none misses it when this node's torchrun, maybe the store's host, is stopped."""
        others = [jobwire.read_key(self.at.rdzv, r) for r in range(len(self.at.nodes)) if r != self.rank]
        try:
            self.setter.wait(others, timedelta(seconds=jobwire.SETTLE))
        except Exception:  # noqa: BLE001 - a node that does not answer in time: it has torchrun's own ends
            pass
        _say("settled")

    def read(self) -> None:
        """Tell the first node this node has read the job's end."""
        try:
            self.waiter.set(jobwire.read_key(self.at.rdzv, self.rank), "1")
        except Exception:  # noqa: BLE001 - the store went meanwhile: nobody waits any more
            pass

    def listen(self) -> None:
        for raw in sys.stdin.buffer:
            msg = jobwire.parse(raw)
            if msg is None:
                continue
            kind = msg.get("kind")
            if kind == "publish":
                self.publish(msg.get("record") or {})
            elif kind == "summary":
                self.gather(msg.get("summary") or {}, float(msg.get("wait") or jobwire.GATHER_WAIT))
            elif kind == "figure":
                self.figure(msg.get("figure"), msg.get("time"))

    def _record(self, **data: Any) -> Dict[str, Any]:
        """A value this node puts in the store: bound to the node and the attempt, as an end record is."""
        return {"node": self.at.nodes[self.rank], "node_rank": self.rank, "attempt": jobwire.attempt_of(self.at),
                **data}

    def _read(self, client: Any, key: str, rank: int) -> Optional[Dict[str, Any]]:
        record, _ = jobwire.check(self.key, _value(client.get(key)).decode("utf-8", "replace"), self.at)
        return record if record is not None and record.get("node_rank") == rank else None

    def gather(self, summary: Dict[str, Any], wait: float) -> None:
        """This node's summary into the store; every node's that verifies said back (this node's too), then
        `gathered`. Bounded by `wait`, whatever the store does."""
        deadline = time.monotonic() + wait
        try:
            client = self.client(max(1.0, wait))
            client.set(jobwire.summary_key(self.at.rdzv, self.rank),
                       jobwire.seal(self.key, self._record(summary=summary), self.at))
        except Exception as exc:  # noqa: BLE001 - the store went: this node's verdict is read from its own summary
            _say("gathered", why="cannot put this node's summary into the job's store: %s" % exc)
            return
        for rank in range(len(self.at.nodes)):
            key = jobwire.summary_key(self.at.rdzv, rank)
            try:
                client.wait([key], timedelta(seconds=max(0.05, deadline - time.monotonic())))
                record = self._read(client, key, rank)
            except Exception:  # noqa: BLE001 - that node's summary did not come in time: the verdict says so
                continue
            if record is not None and isinstance(record.get("summary"), dict):
                _say("summary", rank=rank, summary=record["summary"])
        _say("gathered")

    def figure(self, value: Any, at: Any) -> None:
        """This node's throughput figure into the store; the other nodes' latest said back."""
        if not isinstance(value, (int, float)):
            return
        try:
            if self.figures_client is None:
                self.figures_client = self.client(WAIT_SLICE)
            client = self.figures_client
            client.set(jobwire.figure_key(self.at.rdzv, self.rank),
                       jobwire.seal(self.key, self._record(figure=float(value), time=at), self.at))
            others = {}
            for rank in range(len(self.at.nodes)):
                key = jobwire.figure_key(self.at.rdzv, rank)
                if rank == self.rank or not client.check([key]):
                    continue
                record = self._read(client, key, rank)
                if record is not None:
                    others[str(rank)] = {"node": record["node"], "figure": record.get("figure"), "time": record.get("time")}
        except Exception:  # noqa: BLE001 - the store is busy or gone: the next figure tries again
            self.figures_client = None
            return
        _say("figures", figures=others)

    def wait(self) -> bool:
        """Until the job's end is in a slot (True), or the store went for good before it (False)."""
        said_full = False
        while not self.done.is_set():
            slot = self.next
            try:
                if slot > MAX_SLOTS:  # that many values that are not the end: only whether the store goes is watched
                    if not said_full:
                        said_full = True
                        _say("lost", why="%d values under %s that are not this attempt's end: this node reads no more "
                                         "of them" % (MAX_SLOTS, jobwire.store_key(self.at.rdzv)))
                    time.sleep(1.0)
                    if not self.answers():
                        raise ConnectionError("the store went away")
                    continue
                key = jobwire.store_key(self.at.rdzv, slot)
                self.waiter.wait([key], timedelta(seconds=WAIT_SLICE))
                self.judge(slot, self.waiter.get(key))
            except Exception:  # noqa: BLE001 - a timeout, or the store is gone (torchrun on node 0 ended)
                if self.answers() or self.done.is_set():
                    continue
                if not self.regain():
                    return self.done.is_set()
        return True

    def answers(self) -> bool:
        try:
            self.waiter.check([self.mark])
        except Exception:  # noqa: BLE001
            return False
        return True


def main(argv: list) -> int:
    (run_id,) = argv
    import signal

    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))  # the watchdog ends the link: no interpreter shutdown
    d = p.run_dir(run_id)
    job = watchfile.read_or_default(d).job or watchfile.Job()
    rdzv = (read_text(os.path.join(d, p.RDZV_ID)) or run_id).strip()
    at = jobwire.Attempt(job.id or run_id, rdzv, tuple(job.nodes))
    host, _, port = job.endpoint.rpartition(":")
    try:
        dist = importlib.import_module("torch.distributed")  # the training's torch, never the watchdog's
    except ImportError as exc:
        _say("lost", why="no torch in the training's environment (%s): the job's end reaches this node through "
                         "torchrun only" % exc)
        return 3
    link = Link(dist, host.strip("[]"), int(port), job.key, at, job.node_rank)
    try:
        link.connect(time.monotonic() + CONNECT_FOR)
    except Exception as exc:  # noqa: BLE001 - whatever torch raises, the watchdog is told why
        _say("lost", why="cannot reach the rendezvous store at %s:%s: %s" % (host, port, exc))
        return 4
    _say("connected", key=jobwire.store_key(rdzv))
    threading.Thread(target=link.listen, daemon=True, name="gpuops-job-publish").start()
    if not link.wait():
        _say("gone", why="the rendezvous store at %s:%s went away before the job's end and did not come back within "
                         "%gs (torchrun on node 0 ended, or its host went)" % (host, port, jobwire.STORE_GRACE))
        return 0
    link.read()
    # Held until the store goes (node 0's torchrun ended), so that the watchdog can tell when a restart
    # may start; its EOF is the sign.
    while link.answers():
        time.sleep(0.2)
    return 0


tool_job_store = main
