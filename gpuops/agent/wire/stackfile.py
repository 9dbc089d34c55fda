"""Thread stacks of a run's Python processes: where they are kept, and the one parser of their text.

`stacks/<pid>.txt` in the run directory holds one process's threads as the taker wrote them (a
``#`` header, then py-spy's or faulthandler's own output). Imported by the training's processes too
(guard/stackdump.py registers faulthandler), so this module imports only ``os`` and ``re``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, NamedTuple, Optional

STACKS = "stacks"  # the folder, in the run directory
#: stacks/<pid>.signal: the signal gpuops' faulthandler listens on in that process, the process's start
#: tick, and the descriptor faulthandler writes to (see Registration).
SIGNAL_SUFFIX = ".signal"
#: stacks/<pid>.fault: what faulthandler appends to (it needs its file open from the start).
FAULT_SUFFIX = ".fault"
#: stacks/<pid>.txt: the process's stacks as last taken.
TEXT_SUFFIX = ".txt"
VIA_PYSPY, VIA_FAULTHANDLER = "py-spy", "faulthandler"
#: watch.stacks: take them before a stall's abort (default), before every abort, or never.
ON_STALL, ALWAYS, OFF = "on_stall", "always", "off"
POLICIES = (ON_STALL, ALWAYS, OFF)

# faulthandler: `Current thread 0x00007f.. (most recent call first):` then `  File "f.py", line 3 in name`
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*?)\])? \(most recent call first\):")
_FH_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
# py-spy dump: `Thread 1234 (idle): "MainThread"` then `    name (file.py:3)` or a native `    name (lib.so)`
_PS_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([^)]*)\)(?:: "(.*)")?')
_PS_FRAME = re.compile(r"^ {4}(\S.*?) \((.*?)(?::(\d+))?\)$")


def name(pid: int, suffix: str) -> str:
    """A record's name inside stacks/."""
    return "%d%s" % (pid, suffix)


class Registration(NamedTuple):
    """stacks/<pid>.signal: what the process registered. `fd` is the descriptor faulthandler writes its dump
    to, which must still be stacks/<pid>.fault when the watchdog signals (None: a record that names none)."""

    signum: int
    tick: str  # the process's start time in clock ticks (/proc/<pid>/stat field 22): the pid is still it
    fd: Optional[int]


def registration_text(reg: Registration) -> str:
    return "%d %s %d\n" % (reg.signum, reg.tick, -1 if reg.fd is None else reg.fd)


def read_registration(text: str) -> Optional[Registration]:
    """A .signal record's fields; None where it is not one (torn, garbled)."""
    parts = text.split()
    try:
        fd = int(parts[2]) if len(parts) > 2 else -1
        return Registration(int(parts[0]), parts[1], fd if fd >= 0 else None)
    except (IndexError, ValueError):
        return None


def parse(text: str) -> List[Dict[str, Any]]:
    """Each thread of a stacks text: {id, name, state, frames: [{function, file, line}]}, innermost frame first."""
    threads: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head = _FH_THREAD.match(line) or _PS_THREAD.match(line)
        if head is not None:
            fh = head.re is _FH_THREAD
            threads.append({"id": head.group(1), "name": head.group(2) if fh else head.group(3),
                            "state": None if fh else head.group(2), "frames": []})
            continue
        if not threads:
            continue
        frame = _FH_FRAME.match(line)
        if frame is not None:
            threads[-1]["frames"].append({"function": frame.group(3), "file": frame.group(1), "line": int(frame.group(2))})
            continue
        frame = _PS_FRAME.match(line)
        if frame is not None:
            threads[-1]["frames"].append({"function": frame.group(1), "file": frame.group(2),
                                          "line": int(frame.group(3)) if frame.group(3) else None})
    return threads


def functions(text: str) -> List[str]:
    """Every function name on any thread's stack, in order of appearance (what a reader greps for)."""
    return [f["function"] for t in parse(text) for f in t["frames"]]
