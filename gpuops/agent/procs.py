"""Processes on the target, as /proc shows them: alive or not, the run's own (by marker and descent)."""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Set

#: The environment entry every process of a run carries (run.sh and warmup.sh export it).
MARKER = b"GPUOPS_RUN_ID="


def running(pid: int) -> bool:
    """The process exists and is no zombie (a killed process whose parent never reaped it)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            text = fh.read(4096)
    except OSError:
        return False
    return text.rsplit(b")", 1)[-1].split()[:1] != [b"Z"]


def _pids() -> List[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def marked(run_id: str) -> List[int]:
    """Live processes whose environment carries the run's marker (the job and its workers)."""
    want = MARKER + run_id.encode()
    me = os.getpid()
    found = []
    for pid in _pids():
        if pid == me:
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if want in env.split(b"\0") and running(pid):
            found.append(pid)
    return found


def parents() -> Dict[int, int]:
    """pid -> parent pid of every process now."""
    out = {}
    for pid in _pids():
        try:
            with open("/proc/%d/stat" % pid, "rb") as fh:
                fields = fh.read(4096).rsplit(b")", 1)[-1].split()
            out[pid] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(roots: Iterable[int]) -> Set[int]:
    """Every live process below the roots (a worker that cleared its environment is still a child)."""
    children: Dict[int, List[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    seen: Set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen
