"""Take every thread's stack of every Python process of a run, without stopping it: stacks/<pid>.txt.

Through ``py-spy dump --native`` where py-spy is on the watchdog's PATH or the process's own,
else through the faulthandler gpuops registered in the process (guard/stackdump.py): its signal,
read from stacks/<pid>.signal, sent only where the process's start tick still matches, the
process catches it (an uncaught real-time signal would kill it), and the descriptor faulthandler
writes to still is stacks/<pid>.fault (a training that closed its descriptors may have reopened that
number on its own checkpoint: that process is skipped, its row saying why). Bounded: a process that does not
answer within WAIT seconds is noted and the caller goes on. The abort sequence calls ``take``
before its signal (watch.stacks); ``python3 -m gpuops_agent stacks RUN_ID [recorded]`` prints
them now, or as last recorded, one ``stacks`` marker per process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from ..system.procs import descendants, marked, running
from ..wire import marks
from ..wire import protocol as p
from ..wire import stackfile as sf
from ..wire.flight import FIFO_SUFFIX
from ..wire.records import read_json

#: Seconds a process gets to answer (py-spy, then faulthandler for those py-spy did not do).
WAIT = 4.0
#: A faulthandler dump is taken for complete once its file stops growing for this long.
SETTLE = 0.15
POLL = 0.02


def wanted(policy: str, reason: Optional[str], first: Optional[str] = None) -> bool:
    """watch.stacks says take them before this abort (its abort.json `reason`; `first`: the job's first node's
    reason where another node of a torchrun job ended it: its stall or its failure is where the job hung)."""
    return policy == sf.ALWAYS or (policy == sf.ON_STALL and (reason == "stall" or first in ("stall", "failed")))


def rank_env(pid: int) -> Dict[str, Any]:
    """The place torchrun gave a process (RANK, LOCAL_RANK, GROUP_RANK in its environment), as ints; {} for none."""
    out: Dict[str, Any] = {}
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            for entry in fh.read(1 << 20).split(b"\0"):
                key, _, value = entry.partition(b"=")
                if key in (b"RANK", b"LOCAL_RANK", b"GROUP_RANK"):
                    out[key.decode().lower()] = int(value)
    except (OSError, ValueError):
        pass
    return out


def _is_python(pid: int) -> bool:
    try:
        exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        return False
    return exe.startswith("python") or exe.startswith("pypy")


def python_pids(folder: str, run_id: str) -> List[int]:
    """The run's processes (its marker, and everything below them) that are Python."""
    ours = set(marked(run_id, os.path.dirname(os.path.abspath(folder))))
    ours |= descendants(ours)
    registered = {int(n.split(".")[0]) for n in _names(folder) if n.endswith(sf.SIGNAL_SUFFIX) and n[0].isdigit()}
    return sorted(pid for pid in ours if running(pid) and (pid in registered or _is_python(pid))
                  and not _is_agent(pid))


def _is_agent(pid: int) -> bool:
    """gpuops' own process in the run (the pane's relay, `-m gpuops_agent pane`): not the training's."""
    argv = _cmdline(pid).split()
    return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == [p.PACKAGE]


def _names(folder: str) -> List[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _env_path(pid: int) -> str:
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            for entry in fh.read().split(b"\0"):
                if entry.startswith(b"PATH="):
                    return entry[5:].decode("utf-8", "replace")
    except OSError:
        pass
    return ""


def pyspy_for(pid: int) -> Optional[str]:
    """py-spy on the watchdog's PATH, else on the process's own (a venv's bin)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=_env_path(pid) or None)


def _cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return " ".join(fh.read(4096).replace(b"\0", b" ").decode("utf-8", "replace").split())
    except OSError:
        return ""


def _header(pid: int, via: str) -> str:
    return "# gpuops stacks of pid %d via %s at %s: %s\n" % (
        pid, via, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), _cmdline(pid)[:300])


def _signal_of(folder: str, pid: int) -> Tuple[Optional[int], str]:
    """(the faulthandler signal to send, "") where the process may be signalled; else (None, why not):
    why is "" where gpuops' faulthandler is not there (no record of this process, or it does not catch
    the signal), words where it is there but its descriptor is no longer the stack file."""
    try:
        with open(os.path.join(folder, sf.name(pid, sf.SIGNAL_SUFFIX))) as fh:
            reg = sf.read_registration(fh.read(256))
        if reg is None:
            return None, ""
        with open("/proc/%d/stat" % pid, "rb") as fh:
            if fh.read(4096).rsplit(b")", 1)[-1].split()[19].decode() != reg.tick:
                return None, ""  # the pid was reused
        with open("/proc/%d/status" % pid) as fh:
            caught = next(int(ln.split()[1], 16) for ln in fh if ln.startswith("SigCgt:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None, ""
    if not caught & (1 << (reg.signum - 1)):
        return None, ""
    why = _not_the_stack_file(folder, pid, reg.fd)
    return (None, why) if why else (reg.signum, "")


def _not_the_stack_file(folder: str, pid: int, fd: Optional[int]) -> str:
    """Why faulthandler's descriptor in the process is not (or cannot be shown to be) stacks/<pid>.fault;
    "" where it is. A dump through it would land in whatever file the training has on that number."""
    said = "not signalled: "
    if fd is None:
        return said + "its record names no stack file descriptor to check"
    path = os.path.join(folder, sf.name(pid, sf.FAULT_SUFFIX))
    link = "/proc/%d/fd/%d" % (pid, fd)
    try:
        want = os.stat(path)
    except OSError:
        return said + "its stack file %s is gone" % sf.name(pid, sf.FAULT_SUFFIX)
    try:
        got = os.stat(link)
    except FileNotFoundError:
        return said + "the process closed gpuops' stack file descriptor %d" % fd
    except OSError as exc:
        return said + "gpuops' stack file descriptor %d cannot be checked (%s)" % (fd, exc.strerror)
    if (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino):
        return ""
    try:
        now = os.readlink(link)
    except OSError:
        now = "another file"
    return said + ("gpuops' stack file descriptor %d is now %s in the process (it closed the stack file and "
                   "reused the number): no dump written into it" % (fd, now[:300]))


def _write(folder: str, pid: int, via: str, text: str) -> Dict[str, Any]:
    path = os.path.join(folder, sf.name(pid, sf.TEXT_SUFFIX))
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(_header(pid, via) + text)
    os.replace(path + ".tmp", path)
    return {"pid": pid, "file": p.STACKS + "/" + sf.name(pid, sf.TEXT_SUFFIX), "threads": len(sf.parse(text)), "via": via}


def _by_pyspy(folder: str, pids: List[int], deadline: float) -> Dict[int, Dict[str, Any]]:
    """py-spy dump for each pid at once; what answered in time."""
    procs: Dict[int, subprocess.Popen] = {}
    for pid in pids:
        tool = pyspy_for(pid)
        if tool:
            procs[pid] = subprocess.Popen([tool, "dump", "--pid", str(pid), "--native"], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    done: Dict[int, Dict[str, Any]] = {}
    for pid, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            continue
        text = out.decode("utf-8", "replace")
        if proc.returncode == 0 and sf.parse(text):
            done[pid] = _write(folder, pid, sf.VIA_PYSPY, text)
    return done


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def _by_faulthandler(folder: str, pids: List[int], deadline: float
                     ) -> Tuple[Dict[int, Dict[str, Any]], Dict[int, str]]:
    """Each registered pid's signal sent at once (where its descriptor still is its stack file); its dump
    read once its file stops growing. Returns the dumps and, for each pid skipped, why."""
    sent: Dict[int, Tuple[str, int]] = {}
    skipped: Dict[int, str] = {}
    for pid in pids:
        signum, why = _signal_of(folder, pid)
        path = os.path.join(folder, sf.name(pid, sf.FAULT_SUFFIX))
        before = _size(path)
        if why:
            skipped[pid] = why
        if signum is None or before < 0:
            continue
        try:
            os.kill(pid, signum)
        except OSError:
            continue
        sent[pid] = (path, before)
    grown: Dict[int, Tuple[int, float]] = {}
    done: Dict[int, Dict[str, Any]] = {}
    while sent and time.monotonic() < deadline:
        now = time.monotonic()
        for pid, (path, before) in list(sent.items()):
            size = _size(path)
            if size > before and grown.get(pid, (None,))[0] == size and now - grown[pid][1] >= SETTLE:
                with open(path, "rb") as fh:
                    fh.seek(before)
                    done[pid] = _write(folder, pid, sf.VIA_FAULTHANDLER, fh.read().decode("utf-8", "replace"))
                del sent[pid]
            elif size > before and grown.get(pid, (None,))[0] != size:
                grown[pid] = (size, now)
        time.sleep(POLL)
    return done, skipped


def _tidy(folder: str) -> None:
    """Records of processes that are gone (killed before their exit could remove them): a Flight Recorder
    helper's pipe too (wire/flight.py; a copy of the folder would block on it)."""
    for entry in _names(folder):
        if not entry.endswith((sf.SIGNAL_SUFFIX, FIFO_SUFFIX)) or not entry.split(".")[0].isdigit():
            continue
        pid = int(entry.split(".")[0])
        if running(pid):
            continue
        for suffix in (sf.SIGNAL_SUFFIX, sf.FAULT_SUFFIX, FIFO_SUFFIX):
            path = os.path.join(folder, sf.name(pid, suffix))
            if suffix != sf.FAULT_SUFFIX or _size(path) == 0:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def take(d: str, run_id: str, wait: float = WAIT) -> List[Dict[str, Any]]:
    """Every Python process's stacks now: [{pid, file, threads, via}], a process that did not answer
    with file None and `error`."""
    folder = os.path.join(d, p.STACKS)
    os.makedirs(folder, exist_ok=True)
    pids = python_pids(folder, run_id)
    _tidy(folder)
    deadline = time.monotonic() + wait
    done = _by_pyspy(folder, pids, deadline)
    # Those py-spy could not do get their faulthandler's time of their own, however long py-spy took.
    by_fh, skipped = _by_faulthandler(folder, [pid for pid in pids if pid not in done],
                                      max(deadline, time.monotonic() + wait / 2))
    done.update(by_fh)
    out = []
    for pid in pids:
        place = {k: v for k, v in rank_env(pid).items() if k in ("rank", "local_rank")}
        if pid in done:
            out.append({**done[pid], **place})
            continue
        registered = pid in skipped or _signal_of(folder, pid)[0] is not None
        via = sf.VIA_FAULTHANDLER if registered else (sf.VIA_PYSPY if pyspy_for(pid) else None)
        why = skipped.get(pid) or (("no answer within %gs" % wait) if via else "neither py-spy nor gpuops' faulthandler is there")
        out.append({"pid": pid, "file": None, "threads": 0, "via": via, "error": why, **place})
    return out


def recorded(d: str) -> List[Dict[str, Any]]:
    """The stacks last taken of the run, each attempt's (a restarted run keeps attempts/<n>/stacks/)."""
    out: List[Dict[str, Any]] = []
    attempts = sorted(int(n) for n in _names(os.path.join(d, p.ATTEMPTS)) if n.isdigit())
    for n, base in [(n, p.attempt_dir(d, n)) for n in attempts] + [(None, d)]:
        listed = (read_json(os.path.join(base, p.ABORT_DONE)) or {}).get("stacks")
        names = sorted(n for n in _names(os.path.join(base, p.STACKS)) if n.endswith(sf.TEXT_SUFFIX))
        rows = listed if isinstance(listed, list) else [{"pid": int(x.split(".")[0]), "file": p.STACKS + "/" + x}
                                                        for x in names if x.split(".")[0].isdigit()]
        for row in rows:
            out.append({**row, **({"attempt": n} if n is not None else {}), "base": base})
    return out


def _text(base: str, row: Dict[str, Any]) -> str:
    if not row.get("file"):
        return ""
    try:
        with open(os.path.join(base, str(row["file"])), encoding="utf-8", errors="replace") as fh:
            return fh.read(4 << 20)
    except OSError:
        return ""


def tool_stacks(argv: List[str]) -> int:
    """stacks RUN_ID [recorded]: each Python process's stacks (taken now, or as recorded), with their text."""
    run_id, mode = argv[0], (argv[1:] or ["now"])[0]
    d = p.run_dir(run_id)
    if not os.path.isdir(d):
        sys.stderr.write("stacks: no run directory %s\n" % d)
        return 2
    rows = recorded(d) if mode == "recorded" else [{**r, "base": d} for r in take(d, run_id)]
    for row in rows:
        base = row.pop("base")
        text = _text(base, row)
        row.setdefault("threads", len(sf.parse(text)))
        print(marks.mark("stacks", json.dumps({**row, "text": text}, sort_keys=True)))
    sys.stdout.flush()
    return 0
