"""Processes on the target, as /proc shows them: alive or not, the run's own (by marker and descent)."""

from __future__ import annotations

import os
import subprocess
from typing import Any, Dict, Iterable, List, Optional, Set

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


def die_with_parent() -> None:
    """In a child we start (a sampler loop, a kernel-log reader): the kernel ends it when we die, even by SIGKILL
    (else every restart would leave a loop behind)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: our own exit stops it
        pass


def end_child(proc: Any) -> None:
    """Stop a child process of ours (a sampler loop): SIGTERM, 5 s, then SIGKILL, and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _pids() -> List[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def marked(run_id: str, run_dir: Optional[str] = None) -> List[int]:
    """Live processes whose environment carries the run's marker (the job and its workers). With `run_dir`: not
    one whose GPUOPS_RUN_DIR is another (a node of the same torchrun job in another container on this kernel, as
    the test bench's share one PID namespace: sh/kill_marked.sh tells them apart the same way)."""
    want = MARKER + run_id.encode()
    here = b"GPUOPS_RUN_DIR=" + run_dir.encode() if run_dir else None
    me = os.getpid()
    found = []
    for pid in _pids():
        if pid == me:
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if here is not None and here not in env and any(e.startswith(b"GPUOPS_RUN_DIR=") for e in env):
            continue
        if want in env and running(pid):
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


def started_at(pid: int) -> Optional[float]:
    """When the process started (epoch seconds), from its start tick and the boot time."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            ticks = int(fh.read(4096).rsplit(b")", 1)[-1].split()[19])
        with open("/proc/stat", "rb") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith(b"btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def run_of(pid: int) -> Optional[str]:
    """The run id a process is marked with, if any."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return None
    for entry in env:
        if entry.startswith(MARKER):
            return entry[len(MARKER):].decode("utf-8", "replace")
    return None
