"""gpuops' Flight Recorder helper in each rank of a torchrun job: a thread that dumps the rank's recorder when asked.

Loaded by pythonpath/sitecustomize.py in every Python process of the training that torchrun started as a
rank (RANK in its environment) of a run whose directory has a ``stacks/`` folder. It makes
``stacks/<pid>.fr``, a FIFO, and a daemon thread that waits in a blocking ``open`` of it: no polling, no
signal, nothing at all until the watchdog opens the other end (agent/run/flight_ask.py). A Python signal
handler would not do: it runs only when the main thread runs Python, and a rank that waits inside a collective
does not (measured on the lent machine, tests/data/real_h200/flight_recorder/); a thread of its own is
scheduled all the same. Asked, it calls ``torch._C._distributed_c10d._dump_fr_trace_json()`` in the training's
own torch (only where the training imported torch: this module never imports it) and writes
``stacks/<pid>.flight.json``: the rank's place (RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE: a dump holds none),
and the dump or one line saying why there is none (no torch imported, a torch without the recorder, a dump
that failed). Then it waits again (a live `gpuops stacks` may ask once more).
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from typing import Any, Dict

from ..wire.flight import FIFO_SUFFIX, FLIGHT_SUFFIX, RANK_VARS, record_text
from ..wire.stackfile import STACKS, name

_state: Dict[str, Any] = {"pid": 0, "fifo": ""}


def _dump(folder: str, request: str) -> None:
    """The recorder's dump (or why none) into stacks/<pid>.flight.json, whole (a rename)."""
    torch = sys.modules.get("torch")
    version, dump, error = None, None, None
    if torch is None:
        error = "the process has not imported torch"
    else:
        version = str(getattr(torch, "__version__", "?"))
        c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
        fn = getattr(c10d, "_dump_fr_trace_json", None)
        if fn is None:
            error = "torch %s has no Flight Recorder (no _dump_fr_trace_json)" % version
        else:
            try:
                raw = fn()
                import json

                dump = json.loads(raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else raw)
            except Exception as exc:  # whatever the recorder raises is said, and the stacks are kept
                error = "the dump failed: %s: %s" % (type(exc).__name__, exc)
    pid = os.getpid()
    path = os.path.join(folder, name(pid, FLIGHT_SUFFIX))
    env = {k: os.environ.get(k, "") for k in RANK_VARS + ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(record_text(env, pid, request, version, dump, error))
    os.replace(path + ".tmp", path)


def _serve(folder: str, fifo: str) -> None:
    """Wait for a request on the FIFO (a blocking open: the thread sleeps in the kernel), answer it, wait again.
    Ends where the FIFO is gone or is no FIFO any more (an open would not block: it would spin)."""
    while True:
        try:
            if not stat.S_ISFIFO(os.stat(fifo).st_mode):
                return
            with open(fifo, "rb") as fh:
                request = fh.read(256).decode("ascii", "replace").strip()
        except OSError:
            return
        if not request:
            continue
        try:
            _dump(folder, request[:64])
        except OSError:
            pass


def _forget() -> None:
    """At exit: the FIFO goes (only this very process's: a forked child inherits the atexit entry)."""
    if _state["pid"] == os.getpid():
        try:
            os.unlink(_state["fifo"])
        except OSError:
            pass


def install() -> bool:
    """In a rank of a gpuops job (RANK set, the run's stacks/ folder there): the FIFO and its thread. True if made."""
    import atexit

    run_dir = os.environ.get("GPUOPS_RUN_DIR") or ""
    folder = os.path.join(run_dir, STACKS)
    if not run_dir or "RANK" not in os.environ or not os.path.isdir(folder) or not hasattr(os, "mkfifo"):
        return False
    pid = os.getpid()
    fifo = os.path.join(folder, name(pid, FIFO_SUFFIX))
    try:
        os.unlink(fifo)  # a dead process's of the same pid
    except OSError:
        pass
    os.mkfifo(fifo, 0o600)
    _state.update(pid=pid, fifo=fifo)
    threading.Thread(target=_serve, args=(folder, fifo), name="gpuops-flight-recorder", daemon=True).start()
    atexit.register(_forget)
    return True
