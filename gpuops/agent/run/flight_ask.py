"""Ask each rank of a torchrun job on this node for its Flight Recorder dump, through gpuops' helper in it.

The helper (agent/guard/flight_helper.py) waits in a blocking open of stacks/<pid>.fr; opening the other end
without blocking (O_NONBLOCK: ENXIO where no thread waits, so a dead process's FIFO costs nothing) and writing
a request wakes it; it writes stacks/<pid>.flight.json, which names the request. Asked all at once, bounded:
a rank that does not answer within the wait is said in one line, and the stacks are kept either way.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from typing import Dict, List, Optional

from ..wire.flight import FIFO_SUFFIX, FLIGHT_SUFFIX, read_record
from ..wire.records import read_text
from ..wire.stackfile import name

#: Seconds the ranks get to answer; a FIFO whose thread is busy answering is tried again within it.
WAIT = 4.0
POLL = 0.02
#: How long a FIFO nobody reads (ENXIO) is tried again: its thread may be between two requests.
BUSY_FOR = 0.5


def _send(fifo: str, request: str) -> Optional[str]:
    """Write the request into the FIFO; None once written, else why not ('busy', or the error)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        return "busy" if exc.errno == errno.ENXIO else (exc.strerror or str(exc))
    try:
        os.write(fd, (request + "\n").encode())
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return None


def helpers(folder: str, pids: List[int]) -> List[int]:
    """The pids among these whose helper made its FIFO (the ranks of the job on this node)."""
    return [pid for pid in pids if os.path.exists(os.path.join(folder, name(pid, FIFO_SUFFIX)))]


def ask(folder: str, pids: List[int], wait: float = WAIT) -> Dict[int, Dict]:
    """pid -> its record (read_record: the rank, its recorder summarized, or `error`), for every pid with a helper."""
    request = secrets.token_hex(8)
    deadline = time.monotonic() + wait
    todo = helpers(folder, pids)
    for pid in todo:
        try:
            os.unlink(os.path.join(folder, name(pid, FLIGHT_SUFFIX)))  # an earlier answer is not this one
        except OSError:
            pass
    out: Dict[int, Dict] = {}
    unsent = {pid: time.monotonic() + BUSY_FOR for pid in todo}
    sent: List[int] = []
    while (unsent or sent) and time.monotonic() < deadline:
        for pid, until in list(unsent.items()):
            why = _send(os.path.join(folder, name(pid, FIFO_SUFFIX)), request)
            if why is None:
                sent.append(pid)
                del unsent[pid]
            elif why != "busy" or time.monotonic() >= until:
                out[pid] = {"pid": pid, "error": "its Flight Recorder helper did not take the request (%s)" % (
                    "nothing reads its pipe: the helper is gone" if why == "busy" else why)}
                del unsent[pid]
        for pid in list(sent):
            rec = read_record(read_text(os.path.join(folder, name(pid, FLIGHT_SUFFIX)), 64 << 20) or "")
            if rec is not None and rec.get("request") == request:
                out[pid] = rec
                sent.remove(pid)
        if unsent or sent:
            time.sleep(POLL)
    for pid in sent + list(unsent):
        out[pid] = {"pid": pid, "error": "its Flight Recorder helper did not answer within %gs" % wait}
    return out
