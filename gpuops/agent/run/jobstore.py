"""The job link: one process per node of a torchrun job, beside its watchdog, holding torchrun's rendezvous store.

`python3 -m gpuops_agent job-store RUN_ID`, started by the watchdog through sh/job_store.sh with the
training's environment, because it needs the training's torch: the store is torchrun's own c10d
TCPStore on node 0 (the port torchrun opened; gpuops opens none). It waits on this attempt's end key
and tells the watchdog (one JSON line on stdout) when any node set it; a line from the watchdog on
stdin asks it to set the key first (compare-and-set: the first node to end is the job's cause).
Everything it reads from the store is checked against the run's key (wire/jobwire.py).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from ..wire import jobwire, watchfile
from ..wire import protocol as p
from ..wire.records import read_text

#: How long to keep trying to reach the store: torchrun's own rendezvous join timeout (600 s).
CONNECT_FOR = 600.0
WAIT_SLICE = 30.0


def _say(kind: str, **data: Any) -> None:
    sys.stdout.buffer.write(jobwire.line(kind, **data))
    sys.stdout.buffer.flush()


def connect(dist: Any, host: str, port: int, deadline: float) -> Any:
    """A client of node 0's store, once torchrun there has opened it."""
    while True:
        try:
            return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=WAIT_SLICE),
                                 wait_for_workers=False)
        except (RuntimeError, OSError, TimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def main(argv: list) -> int:
    (run_id,) = argv
    import signal

    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))  # the watchdog ends the link: no interpreter shutdown
    d = p.run_dir(run_id)
    job = watchfile.read_or_default(d).job or watchfile.Job()
    rdzv = (read_text(os.path.join(d, p.RDZV_ID)) or run_id).strip()
    key, name = job.key, jobwire.store_key(rdzv)
    host, _, port = job.endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        dist = importlib.import_module("torch.distributed")  # the training's torch, never the watchdog's
    except ImportError as exc:
        _say("lost", why="no torch in the training's environment (%s): the job's end reaches this node through "
                         "torchrun only" % exc)
        return 3
    deadline = time.monotonic() + CONNECT_FOR
    try:
        waiter = connect(dist, host, int(port), deadline)
        setter = connect(dist, host, int(port), deadline)
    except Exception as exc:  # noqa: BLE001 - whatever torch raises, the watchdog is told why
        _say("lost", why="cannot reach the rendezvous store at %s:%s: %s" % (host, port, exc))
        return 4
    _say("connected", key=name)
    done = threading.Event()

    def tell(raw: Any) -> None:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        record = jobwire.verify(key, text)
        if record is None:
            _say("forged", why="a value under %s not signed with this run's key was ignored" % name)
            return
        if not done.is_set():
            done.set()
            _say("end", record=record)

    def publish() -> None:
        for raw in sys.stdin.buffer:
            msg = jobwire.parse(raw)
            if msg is None or msg.get("kind") != "publish":
                continue
            try:
                tell(setter.compare_set(name, "", jobwire.sign(key, msg.get("record") or {})))
            except Exception as exc:  # noqa: BLE001
                _say("lost", why="cannot set the job's end in the store: %s" % exc)

    threading.Thread(target=publish, daemon=True, name="gpuops-job-publish").start()
    while not done.is_set():
        try:
            waiter.wait([name], timedelta(seconds=WAIT_SLICE))
        except Exception as exc:  # noqa: BLE001 - a timeout, or the store is gone (torchrun on node 0 ended)
            try:
                waiter.check([name])
            except Exception:  # noqa: BLE001
                _say("lost", why="the rendezvous store went away (torchrun on node 0 ended): %s" % exc)
                return 0
            continue
        tell(waiter.get(name))
    # Held until the store goes (node 0's torchrun ended), so that the watchdog can tell when a restart
    # may start; its EOF is the sign.
    while True:
        try:
            waiter.check([name])
        except Exception:  # noqa: BLE001
            return 0
        time.sleep(0.2)


tool_job_store = main
