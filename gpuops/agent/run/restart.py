"""Restarts (playbook `restart:`): after an attempt ends by a rule in `restart.on`, start training again.

The watchdog does it, so a run is restarted with nobody attached. An attempt that ended is decided
on from its records (`due`); its records then move into attempts/<n>/ and attempt.json says the
next one waits, in one step to a stop's claim (`begin_next`, attempt.file_away); the watchdog waits
out the delay, drains the GPUs (and warms up, if asked) and starts training in the same tmux session
(`carry_out`), then watches it as a new attempt. A `gpuops stop` or `--timeout` (abort.json `by`
stop / timeout) ends the run for good, also while the next attempt waits. Everything here is also
resumed by a watchdog started again after a crash.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any, Callable, Dict, Optional

from .. import SH
from ..system import tmux
from ..wire import protocol as p
from ..wire.records import command_exit_code, outcome, read_json, read_text, write_json_atomic, write_state
from ..wire.watchfile import Restart, Warmup, WatchConfig
from .attempt import FOR_GOOD, current, due, ended_by, file_away, finish_step, moved_on, step_lock  # noqa: F401

POLL = 0.1
def begin_next(d: str, cfg: WatchConfig, after: str, say: Callable[..., None]) -> Dict[str, Any]:
    """Attempt n ended by `after`: record attempt n+1 as waiting, say `restart`, keep attempt n's records."""
    section = cfg.restart or Restart()
    now = current(d)
    n = int(now["attempt"])
    delay = section.delay
    nxt = {"attempt": n + 1, "max_attempts": cfg.max_attempts, "state": p.ATTEMPT_WAITING, "after": after,
           "compile_guard": section.compile_guard, "delay": delay, "warmup": section.warmup,
           "until": round(time.time() + delay, 3)}
    ended = _ended_record(d, now, after)
    with step_lock(d):  # one step to a stop's claim (abort.tool_abort takes the lock too)
        file_away(d, n, ended, nxt, say)
    return nxt


def _ended_record(d: str, rec: Dict[str, Any], after: str) -> Dict[str, Any]:
    """What attempt n was and how it ended (kept beside its records, read by junit and status)."""
    exit_text = read_text(os.path.join(d, p.EXIT_CODE))
    abort = read_json(os.path.join(d, p.ABORT))
    name, code = outcome(exit_text, abort, False, read_json(os.path.join(d, p.HARDWARE)))
    return {"attempt": int(rec["attempt"]), "compile_guard": bool(rec.get("compile_guard")), "outcome": name,
            "exit_code": code, "command_exit_code": command_exit_code(exit_text), "rule": after,
            "by": (abort or {}).get("by"), "line": (abort or {}).get("line"), "excerpt": (abort or {}).get("excerpt"),
            "started": rec.get("started"), "ended": round(time.time(), 3)}


def stopped(d: str) -> bool:
    """Someone (`gpuops stop`, --timeout, a client) claimed the waiting attempt's abort."""
    return os.path.exists(os.path.join(d, p.ABORT))


def carry_out(d: str, cfg: WatchConfig, beat: Callable[[Dict[str, Any]], None], say: Callable[..., None]) -> bool:
    """A pending attempt: wait its delay, warm up if asked, start training. False: the run ends here."""
    with step_lock(d):  # a restart step its watchdog did not finish (killed mid-way) is finished first
        finish_step(d, say)
    rec = current(d)
    if rec.get("state") not in p.ATTEMPT_PENDING:
        return rec.get("state") != p.ATTEMPT_STOPPED
    path = os.path.join(d, p.ATTEMPT)
    while time.time() < float(rec.get("until") or 0) and not stopped(d):
        beat(rec)
        time.sleep(POLL)
    _guard_flag(d, bool(rec.get("compile_guard")))
    failed = None if stopped(d) else drained(d, cfg, lambda: beat(rec))
    if failed is None and rec["state"] == p.ATTEMPT_WAITING and rec.get("warmup") and not stopped(d):
        failed = warm_up(d, cfg, lambda: beat(rec))
    if failed is not None and not stopped(d):
        write_json_atomic(path, {**rec, "state": p.ATTEMPT_RUNNING, "start_failed": failed["message"]})
        say("restart_failed", attempt=rec["attempt"], message=failed["message"], **failed.get("why", {}))
        with open(os.path.join(d, p.EXIT_CODE), "w") as fh:
            fh.write("%d\n" % failed["code"])
        return False
    if stopped(d):
        return _stopped(d, rec, say)
    rec = {**rec, "state": p.ATTEMPT_STARTING}
    write_json_atomic(path, rec)
    beat(rec)
    if not os.path.exists(os.path.join(d, p.STARTED)) and not tmux.alive(cfg.session):
        from .start import start_training

        result = start_training(os.path.basename(d), d, cfg.session)
        if result.returncode != 0:
            why = "cannot start training: " + (result.stderr.decode("utf-8", "replace").strip()[-300:]
                                               or "tmux exited %d" % result.returncode)
            write_json_atomic(path, {**rec, "state": p.ATTEMPT_RUNNING, "start_failed": why})  # `ended` says it
            say("restart_failed", attempt=rec["attempt"], message=why)
            with open(os.path.join(d, p.EXIT_CODE), "w") as fh:
                fh.write("%d\n" % 71)
            return False
    if stopped(d):  # a stop got in between: training must not go on
        tmux.kill(cfg.session)
        return _stopped(d, rec, say)
    write_json_atomic(path, {**rec, "state": p.ATTEMPT_RUNNING, "started": round(time.time(), 3)})
    say("attempt_started", attempt=rec["attempt"], max_attempts=rec.get("max_attempts"),
        compile_guard=bool(rec.get("compile_guard")))
    return True


def _stopped(d: str, rec: Dict[str, Any], say: Callable[..., None]) -> bool:
    """The run was stopped while the attempt waited: for good. Wait for the stopper's record, then reap:
    its sequence may have run before this attempt's session existed, and found nothing to stop."""
    from .abort import reap, wait_done

    write_json_atomic(os.path.join(d, p.ATTEMPT), {**rec, "state": p.ATTEMPT_STOPPED})
    record = read_json(os.path.join(d, p.ABORT)) or {}
    say("restart_cancelled", attempt=rec["attempt"], stopped_by=record.get("by"), reason=record.get("reason"))
    wait_done(d, 120.0)
    reap(os.path.basename(d))
    return False


def drained(d: str, cfg: WatchConfig, beat: Callable[[], None]) -> Optional[Dict[str, Any]]:
    """Whatever ended the attempt before (an abort drains; an exit, a crash or a vanished session did
    not), the next one starts only on GPUs back under the idle threshold: the run's own escaped holders
    are killed; a GPU someone else holds ends the run, naming them (status 4 in exit_code, as a busy GPU
    at preflight: the next attempt never ran; the run's outcome is failed)."""
    from .abort import drain_or_name

    _, held_by = drain_or_name(d, list(cfg.gpus), cfg.max_memory_used_mib, beat=beat)
    if not held_by:
        return None
    named = "; ".join("GPU %s held by pids %s" % (g, pids or "unknown (nvidia-smi lists none)") for g, pids in held_by.items())
    return {"code": 4, "message": "the GPUs did not drain after attempt %d ended (%s)" % (current(d)["attempt"] - 1, named),
            "why": {"held_by": held_by}}


def _guard_flag(d: str, on: bool) -> None:
    """The compile-guard record run.sh and warmup.sh read (sh/common.sh guard_env)."""
    path = os.path.join(d, p.COMPILE_GUARD)
    if on:
        with open(path, "w") as fh:
            fh.write("1\n")
    elif os.path.exists(path):
        os.unlink(path)


def warm_up(d: str, cfg: WatchConfig, beat: Callable[[], None]) -> Optional[Dict[str, Any]]:
    """The playbook's warmups again, one GPU after another as launch runs them; None, or what failed."""
    from .abort import drain

    warm = (cfg.restart.warmup_spec if cfg.restart is not None else None) or Warmup()
    timeout = warm.timeout
    for gpu in warm.gpus:
        command = substitute(warm.command, gpu)
        with open(os.devnull, "wb") as null:
            proc = subprocess.Popen(["bash", os.path.join(SH, "warmup.sh"), os.path.basename(d), str(gpu), command],
                                    stdin=subprocess.DEVNULL, stdout=null, stderr=null)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            beat()
            time.sleep(POLL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            return {"code": 124, "message": "warmup on GPU %d timed out after %gs" % (gpu, timeout)}
        if proc.returncode != 0:
            return {"code": proc.returncode, "message": "warmup on GPU %d exited with code %d" % (gpu, proc.returncode)}
        drain([gpu], cfg.max_memory_used_mib, warm.drain_timeout, beat=beat)
    return None


def substitute(template: str, gpu: int) -> str:
    """{gpu} replaced in one left-to-right pass, {{ and }} literal braces (as launch's warmup does)."""
    return re.sub(r"\{\{|\}\}|\{gpu\}", lambda m: {"{{": "{", "}}": "}"}.get(m.group(0), str(gpu)), template)


_last_beat = [0.0]


def heartbeat(d: str, rec: Dict[str, Any], force: bool = False) -> bool:
    """The watchdog's heartbeat while an attempt waits: clients see it alive and restarting. True when it
    beat (the caller pulses the supervisor then: a wait is no freeze)."""
    if not force and time.time() - _last_beat[0] < p.HEARTBEAT_EVERY:
        return False
    _last_beat[0] = time.time()
    # a failed write (a full disk) is tried again at the next beat; the pulse needs no disk
    write_state(os.path.join(d, p.WATCHDOG), {
        "pid": os.getpid(), "ts": round(time.time(), 3), "state": p.WATCHDOG_RESTARTING, "attempt": rec.get("attempt"),
        "max_attempts": rec.get("max_attempts"), "restart_state": rec.get("state"), "offset": 0})
    return True
