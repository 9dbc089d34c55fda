"""gpuops' faulthandler in each Python process of a run: every thread's stack, on a signal the training does not use.

Loaded by pythonpath/sitecustomize.py in every Python process of the warmup and training (with or
without the compile guard), where the run directory has a ``stacks/`` folder (watch.stacks is not
off). It picks a real-time signal that nothing in the process catches, blocks or ignores, opens
``stacks/<pid>.fault`` (faulthandler needs its file open when it registers), registers
``faulthandler`` on that signal for all threads, and writes the signal, the process's start tick and
the descriptor to ``stacks/<pid>.signal`` so the watchdog knows what to send (and that the pid is still
this process). Nothing else changes: a training that later sets a handler on that very signal gets it,
and gpuops moves to another free one; a forked child registers for its own pid.

The descriptor is one the training will not be handed back: the file is moved to the lowest free one
at or above HIGH_FD (close-on-exec, so an exec'd child does not inherit it; a forked child gets its
own file and closes the parent's copy where it still is that file). A training that closes every
descriptor (a daemon's ``os.closerange``) or ``dup2``s over it leaves faulthandler's number pointing
elsewhere: the watchdog checks ``/proc/<pid>/fd/<fd>`` against the stack file before each signal and
skips the process, saying so, where they differ (run/stacks.py), so a dump never lands in a
training's own file.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
from typing import Any, Dict, List, Optional, Tuple

from ..wire.stackfile import FAULT_SUFFIX, SIGNAL_SUFFIX, STACKS, Registration, name, registration_text

#: The stack file's descriptor is the lowest free one from here (three quarters of a soft RLIMIT_NOFILE
#: below 1009): far above what a training that closed its descriptors opens next (0, 1, 2, 3 ...).
HIGH_FD = 1000

# fd: faulthandler's descriptor; ident: (st_dev, st_ino) of the stack file it was opened on.
_state: Dict[str, Any] = {"signum": 0, "fd": -1, "ident": None, "folder": "", "moved": 0}


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


def _high() -> int:
    """Where the stack file's descriptor goes: HIGH_FD, or lower where the soft descriptor limit is."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return HIGH_FD
    if soft < 0 or soft > HIGH_FD + 8:  # RLIM_INFINITY is -1; 1024, the usual soft limit, keeps HIGH_FD
        return HIGH_FD
    return max(3, soft * 3 // 4)


def _open(folder: str, pid: int) -> Tuple[int, Tuple[int, int]]:
    """stacks/<pid>.fault opened for appending on a high, close-on-exec descriptor; its (dev, inode)."""
    low = os.open(os.path.join(folder, name(pid, FAULT_SUFFIX)), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fd = low
    try:
        import fcntl

        fd = fcntl.fcntl(low, getattr(fcntl, "F_DUPFD_CLOEXEC", fcntl.F_DUPFD), _high())
        os.set_inheritable(fd, False)
        os.close(low)
    except (ImportError, OSError):
        pass  # no free descriptor up there: the low one, which the watchdog checks before each signal as any
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def _still_ours() -> bool:
    """The descriptor in _state is still the stack file it was opened on (the training may have closed or
    replaced it since)."""
    if _state["fd"] < 0 or _state["ident"] is None:
        return False
    try:
        st = os.fstat(_state["fd"])
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == _state["ident"]


def _release() -> None:
    """Close gpuops' descriptor, only where it still is gpuops' stack file (never a training's file that
    took its number)."""
    if _still_ours():
        os.close(_state["fd"])
    _state["fd"], _state["ident"] = -1, None


def _register(folder: str, reopen: bool = False) -> None:
    """faulthandler on a free signal, writing to this pid's stack file (opened again where `reopen`, or
    where the descriptor is no longer the stack file); the record the watchdog reads."""
    signum = pick()
    if signum is None:
        return
    pid = os.getpid()
    if reopen or not _still_ours():
        fd, ident = _open(folder, pid)
        _release()
        _state["fd"], _state["ident"] = fd, ident
    faulthandler.register(signum, file=_state["fd"], all_threads=True, chain=False)
    _state["signum"] = signum
    record = os.path.join(folder, name(pid, SIGNAL_SUFFIX))
    with open(record + ".tmp", "w") as out:
        out.write(registration_text(Registration(signum, _start_tick(), _state["fd"])))
    os.replace(record + ".tmp", record)


def _in_child() -> None:
    """A forked child inherits the handler and the parent's file: it registers for its own pid, on a file of
    its own (the parent's descriptor closed where it still is the parent's stack file)."""
    if _state["signum"]:
        faulthandler.unregister(_state["signum"])
        _state["signum"] = 0
    try:
        _register(_state["folder"], reopen=True)
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
