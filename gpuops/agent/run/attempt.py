"""Which attempt of a run is current, what ended it, and whether a restart is due: read from the run's records.

The abort sequence (abort.py) asks these too, to tell an attempt that is being restarted from a run
that ended, so they live below both it and restarts.py, which carries restarts out. So does the
restart step itself (`file_away`): publishing attempt n+1 and moving attempt n's records away is one
step to a stop's claim (both under `step_lock`), and a step cut short by a killed watchdog is
finished by whoever takes the lock next (`finish_step`), never half-seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any, Callable, Dict, Iterator, Optional

from ..system.pause import pause_at
from ..wire import protocol as p
from ..wire.records import command_exit_code, read_json, read_text, write_json_atomic
from ..wire.watchfile import WatchConfig

#: abort.json `by` values that end a run for good (never restarted).
FOR_GOOD = ("stop", "timeout", "pane")


def current(d: str) -> Dict[str, Any]:
    """The current attempt's record; attempt 1 (running) when the run never restarted."""
    rec = read_json(os.path.join(d, p.ATTEMPT)) or {}
    n = rec.get("attempt")
    if not isinstance(n, int) or n < 1:  # the first attempt: guarded if launch.compile_guard wrote the record
        return {"attempt": 1, "state": p.ATTEMPT_RUNNING, "compile_guard": os.path.exists(os.path.join(d, p.COMPILE_GUARD))}
    return rec


def ended_by(d: str, own: bool = False) -> Optional[str]:
    """The restart.on name of what ended the current attempt (a rule, stall, failed; the gpu-* rule of its
    hardware.json, which restart.on cannot name); None: it succeeded, was stopped for good, was lost, or never
    started training. `own`: what ended it by itself, leaving hardware.json out."""
    abort = read_json(os.path.join(d, p.ABORT))
    if abort is None and os.path.exists(os.path.join(d, p.ABORT)):
        return None  # claimed with no record written (a full disk): a stop's, never restarted
    hardware = None if own else read_json(os.path.join(d, p.HARDWARE))
    if hardware is not None and (abort or {}).get("by") not in FOR_GOOD:
        return str(hardware.get("rule") or "gpu-xid")  # the GPU's own failure: no rule restart.on may name
    if abort is not None:
        if abort.get("by") in FOR_GOOD or abort.get("reason") in FOR_GOOD:
            return None
        return p.RESTART_STALL if abort.get("reason") == "stall" else (str(abort.get("rule") or "") or None)
    code = command_exit_code(read_text(os.path.join(d, p.EXIT_CODE)))
    return p.RESTART_FAILED if code not in (None, 0) else None


def due(d: str, cfg: WatchConfig, own: bool = False) -> Optional[str]:
    """The rule to restart after when the attempt that just ended should be restarted, else None (`own`: as
    ended_by's: what its own end asks for, before its GPUs had their say)."""
    if current(d)["attempt"] >= cfg.max_attempts or not os.path.exists(os.path.join(d, p.STARTED)):
        return None
    name = ended_by(d, own)
    return name if name is not None and cfg.restart is not None and name in cfg.restart.on else None


def moved_on(d: str, before: int) -> bool:
    """A restart began since attempt `before` was read: a stop that lost to its abort must claim again."""
    rec = current(d)
    return int(rec["attempt"]) != before


@contextlib.contextmanager
def step_lock(d: str) -> Iterator[None]:
    """The restart step and a stop's claim, one at a time: flock on the run directory itself (no file to
    create: it works on a full disk); freed by the kernel when its holder dies."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def file_away(d: str, n: int, ended: Dict[str, Any], nxt: Dict[str, Any], say: Callable[..., None]) -> None:
    """Attempt n ended and n+1 waits (call under step_lock): attempts/<n>/attempt.json is written first
    with the step to do (`next`), then attempt.json says n+1, attempt n's records move in, `restart`
    is said and the step's note is dropped."""
    dest = p.attempt_dir(d, n)
    os.makedirs(dest, exist_ok=True)
    write_json_atomic(os.path.join(dest, p.ATTEMPT), {**ended, "next": nxt})
    _complete(d, n, ended, nxt, say)


def finish_step(d: str, say: Callable[..., None]) -> bool:
    """A restart step that was begun and cut short (its watchdog killed mid-way): finished now (call
    under step_lock). True when there was one."""
    n = int(current(d)["attempt"])
    for k in (n, n - 1):
        rec = read_json(os.path.join(p.attempt_dir(d, k), p.ATTEMPT)) if k >= 1 else None
        if rec is not None and isinstance(rec.get("next"), dict):
            _complete(d, k, {x: v for x, v in rec.items() if x != "next"}, rec["next"], say)
            return True
    return False


def _complete(d: str, n: int, ended: Dict[str, Any], nxt: Dict[str, Any], say: Callable[..., None]) -> None:
    dest = p.attempt_dir(d, n)
    if int(current(d)["attempt"]) == n:
        write_json_atomic(os.path.join(d, p.ATTEMPT), nxt)
    pause_at("restart-published")  # test-only: the window a stop used to fall into
    for name in (p.ABORT,) + tuple(r for r in p.ATTEMPT_RECORDS if r != p.ABORT):
        try:
            os.rename(os.path.join(d, name), os.path.join(dest, name))
        except FileNotFoundError:
            pass
    if os.path.isdir(os.path.join(dest, p.STACKS)):  # the next attempt's processes register there again
        os.makedirs(os.path.join(d, p.STACKS), exist_ok=True)
    say("restart", attempt=n + 1, max_attempts=nxt.get("max_attempts"), after=nxt.get("after"),
        compile_guard=bool(nxt.get("compile_guard")), delay=nxt.get("delay"), warmup=bool(nxt.get("warmup")),
        previous=ended)
    write_json_atomic(os.path.join(dest, p.ATTEMPT), ended)
