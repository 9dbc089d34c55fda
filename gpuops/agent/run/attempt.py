"""Which attempt of a run is current, what ended it, and whether a restart is due: read from the run's records.

The abort sequence (abort.py) asks these too, to tell an attempt that is being restarted from a run
that ended, so they live below both it and restarts.py, which carries restarts out.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ..wire import protocol as p
from ..wire.records import command_exit_code, read_json, read_text

#: abort.json `by` values that end a run for good (never restarted).
FOR_GOOD = ("stop", "timeout", "pane")


def current(d: str) -> Dict[str, Any]:
    """The current attempt's record; attempt 1 (running) when the run never restarted."""
    rec = read_json(os.path.join(d, p.ATTEMPT)) or {}
    n = rec.get("attempt")
    if not isinstance(n, int) or n < 1:  # the first attempt: guarded if launch.compile_guard wrote the record
        return {"attempt": 1, "state": p.ATTEMPT_RUNNING, "compile_guard": os.path.exists(os.path.join(d, p.COMPILE_GUARD))}
    return rec


def max_attempts(cfg: Dict[str, Any]) -> int:
    """The first attempt and the restarts after it."""
    return 1 + int((cfg.get("restart") or {}).get("max") or 0)


def ended_by(d: str) -> Optional[str]:
    """The restart.on name of what ended the current attempt (a rule, stall, failed); None: it succeeded,
    was stopped for good, was lost, or never started training."""
    abort = read_json(os.path.join(d, p.ABORT))
    if abort is not None:
        if abort.get("by") in FOR_GOOD or abort.get("reason") in FOR_GOOD:
            return None
        return p.RESTART_STALL if abort.get("reason") == "stall" else (str(abort.get("rule") or "") or None)
    code = command_exit_code(read_text(os.path.join(d, p.EXIT_CODE)))
    return p.RESTART_FAILED if code not in (None, 0) else None


def due(d: str, cfg: Dict[str, Any]) -> Optional[str]:
    """The rule to restart after when the attempt that just ended should be restarted, else None."""
    section = cfg.get("restart") or {}
    if current(d)["attempt"] >= max_attempts(cfg) or not os.path.exists(os.path.join(d, p.STARTED)):
        return None
    name = ended_by(d)
    return name if name is not None and name in (section.get("on") or ()) else None


def moved_on(d: str, before: int) -> bool:
    """A restart began since attempt `before` was read: a stop that lost to its abort must claim again."""
    rec = current(d)
    return int(rec["attempt"]) != before
