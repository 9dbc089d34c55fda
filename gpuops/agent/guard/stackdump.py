"""gpuops' faulthandler in each Python process of a run: every thread's stack, on a signal the training does not use.

Loaded by pythonpath/sitecustomize.py in every Python process of the warmup and training (with or
without the compile guard), where the run directory has a ``stacks/`` folder (watch.stacks is not
off). It picks a real-time signal that nothing in the process catches, blocks or ignores, opens
``stacks/<pid>.fault`` (faulthandler needs its file open when it registers), registers
``faulthandler`` on that signal for all threads, and writes the signal with the process's start
tick to ``stacks/<pid>.signal`` so the watchdog knows what to send (and that the pid is still this
process). Nothing else changes: a training that later sets a handler on that very signal gets it,
and gpuops moves to another free one; a forked child registers for its own pid.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
from typing import Any, Dict, List, Optional

from ..wire.stackfile import FAULT_SUFFIX, SIGNAL_SUFFIX, STACKS, name

_state: Dict[str, Any] = {"signum": 0, "file": None, "folder": "", "moved": 0}


def _sigmask(field: str) -> int:
    """A SigCgt/SigBlk/SigIgn mask of this process (the C level: what any library set, not only Python)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def candidates() -> List[int]:
    """Real-time signals in the middle of the range (glibc and a few libraries use its ends)."""
    low = int(getattr(signal, "SIGRTMIN", 34))
    high = int(getattr(signal, "SIGRTMAX", 64))
    return list(range(low + 6, min(high - 4, low + 24) + 1))


def _free(signum: int, taken: int) -> bool:
    try:
        if signal.getsignal(signum) not in (signal.SIG_DFL, None):
            return False
    except (ValueError, OSError):
        return False
    return not taken & (1 << (signum - 1))


def pick() -> Optional[int]:
    """The first candidate nothing in this process catches, blocks or ignores; None if none is."""
    taken = _sigmask("SigCgt") | _sigmask("SigBlk") | _sigmask("SigIgn")
    return next((s for s in candidates() if _free(s, taken)), None)


def _start_tick() -> str:
    try:
        with open("/proc/self/stat", "rb") as fh:
            return fh.read(4096).rsplit(b")", 1)[-1].split()[19].decode()
    except (OSError, IndexError):
        return "0"


def _register(folder: str) -> None:
    signum = pick()
    if signum is None:
        return
    pid = os.getpid()
    fh = open(os.path.join(folder, name(pid, FAULT_SUFFIX)), "a")
    faulthandler.register(signum, file=fh, all_threads=True, chain=False)
    old, _state["file"], _state["signum"] = _state["file"], fh, signum
    if old is not None:
        old.close()
    record = os.path.join(folder, name(pid, SIGNAL_SUFFIX))
    with open(record + ".tmp", "w") as out:
        out.write("%d %s\n" % (signum, _start_tick()))
    os.replace(record + ".tmp", record)


def _in_child() -> None:
    """A forked child inherits the handler and the parent's file: it registers for its own pid."""
    if _state["signum"]:
        faulthandler.unregister(_state["signum"])
    try:
        _register(_state["folder"])
    except OSError:
        pass


def _wrap_signal() -> None:
    """signal.signal as it was, except that setting gpuops' signal first moves gpuops to another one."""
    original = signal.signal
    if getattr(original, "_gpuops", False):
        return

    @functools.wraps(original)
    def gpuops_signal(signalnum: Any, handler: Any) -> Any:
        if not _state["signum"] or int(signalnum) != _state["signum"]:
            return original(signalnum, handler)
        faulthandler.unregister(_state["signum"])  # first: it would put back what it replaced over the new handler
        _state["signum"] = 0
        try:
            previous = original(signalnum, handler)
            _state["moved"] += 1
            return previous
        finally:
            try:
                _register(_state["folder"])
            except OSError:
                pass

    gpuops_signal._gpuops = True  # type: ignore[attr-defined]
    signal.signal = gpuops_signal


def _forget() -> None:
    """At exit: this pid's records go (a later process may get the pid); a dump it wrote stays."""
    folder, pid = _state["folder"], os.getpid()
    for suffix in (SIGNAL_SUFFIX, FAULT_SUFFIX):
        path = os.path.join(folder, name(pid, suffix))
        try:
            if suffix == SIGNAL_SUFFIX or os.path.getsize(path) == 0:
                os.unlink(path)
        except OSError:
            pass


def install() -> bool:
    """Register in this process when it belongs to a gpuops run that takes stacks; True if registered."""
    import atexit

    run_dir = os.environ.get("GPUOPS_RUN_DIR") or ""
    folder = os.path.join(run_dir, STACKS)
    if not run_dir or not os.path.isdir(folder) or not hasattr(faulthandler, "register"):
        return False
    _state["folder"] = folder
    _register(folder)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_in_child)
    _wrap_signal()
    atexit.register(_forget)
    return bool(_state["signum"])
