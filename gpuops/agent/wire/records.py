"""Run-directory records: their names, tolerant reads, atomic writes, and the one outcome mapping.

Both sides decide a run's outcome from the same facts (the exit_code file, abort.json, whether the
tmux session lives, and hardware.json: a GPU's own failure) through ``outcome``, so the watchdog,
``status``, ``runs`` and the profile can never disagree on what happened.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Tuple

__all__ = [
    "ABORT", "EXIT_CODE", "LOG", "META", "PROFILE", "SAMPLES", "SAMPLES_COARSE",
    "command_exit_code", "outcome", "read_json", "read_text", "write_json_atomic",
]

from . import protocol as p
from .detector_list import hardware_rules
from .protocol import ABORT, EXIT_CODE, LOG, META, PROFILE, SAMPLES, SAMPLES_COARSE, RunState  # the names' one home

#: abort.json reason -> (outcome, exit code); any other reason is a matched rule.
_ABORT_OUTCOMES = {
    "stall": (RunState.STALLED, p.ExitCode.STALLED),
    "timeout": (RunState.TIMEOUT, p.ExitCode.TIMEOUT),
    "stop": (RunState.STOPPED, p.ExitCode.TRAINING_FAILED),
    "interrupt": (RunState.INTERRUPTED, p.ExitCode.INTERRUPTED),  # a Ctrl-C typed in the run's tmux pane (by: pane)
}

StateAndCode = Tuple[RunState, Optional[int]]  # a run's state and gpuops' exit code for it


def command_exit_code(text: str | None) -> int | None:
    """The training command's status from the exit_code file's text; None if absent or garbled."""
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def outcome(exit_code_text: str | None, abort: dict | None, session_alive: bool,
            hardware: dict | None = None) -> StateAndCode:
    """The run's outcome name and gpuops exit code; (running, None) while it goes on.

    An abort record decides (it is written before the session is killed, so the command's own
    exit status after Ctrl-C says nothing); then the command's exit status; a run with neither
    whose session is gone was lost (killed by hand, container stopped). An exit_code file that
    exists but does not hold a number still means the command ended: failed. A GPU's own failure
    (a gpu-* rule's abort, or hardware.json beside a stall, a failure or a lost run) is `hardware`,
    exit 10; a stop, a timeout or another rule still decide as they would.
    """
    if abort is not None:
        if str(abort.get("rule")) in hardware_rules() and abort.get("reason") in ("match", p.JOB_ABORT):
            return RunState.HARDWARE, p.ExitCode.HARDWARE
        if hardware is not None and abort.get("reason") == "stall":
            return RunState.HARDWARE, p.ExitCode.HARDWARE
        if abort.get("reason") == p.JOB_ABORT:  # ended because another node ended the job: that node's cause
            first = str(abort.get("first_reason"))
            if first == p.RESTART_FAILED:
                return RunState.FAILED, p.ExitCode.TRAINING_FAILED
            return _ABORT_OUTCOMES.get(first, (RunState.ABORTED, p.ExitCode.ABORTED))
        return _ABORT_OUTCOMES.get(str(abort.get("reason")), (RunState.ABORTED, p.ExitCode.ABORTED))
    if exit_code_text is not None:
        if command_exit_code(exit_code_text) == 0:
            return RunState.SUCCEEDED, p.ExitCode.OK
        if hardware is not None:
            return RunState.HARDWARE, p.ExitCode.HARDWARE
        return RunState.FAILED, p.ExitCode.TRAINING_FAILED
    if session_alive:
        return RunState.RUNNING, None
    if hardware is not None:
        return RunState.HARDWARE, p.ExitCode.HARDWARE
    return RunState.LOST, p.ExitCode.TRAINING_FAILED


def read_text(path: str, limit: int = 1 << 16) -> str | None:
    """A small record's text, or None when it is missing, unreadable or larger than limit."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    if len(data) > limit:
        return None
    return data.decode("utf-8", "replace")


def read_json(path: str, limit: int = 1 << 20) -> dict | None:
    """A JSON object record, or None when missing, garbled, not an object or over limit bytes."""
    text = read_text(path, limit)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def write_json_atomic(path: str, obj: Any) -> None:
    """Write obj as JSON via a temporary file and a rename: a reader sees the old or the new record, whole
    (an object gets its schema_version)."""
    obj = p.versioned(obj) if isinstance(obj, dict) else obj
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_state(path: str, record: dict) -> Optional[OSError]:
    """A record rewritten every second (a heartbeat): atomically but without fsync. The error when the
    write failed (a full disk): the next beat tries again, and nothing that watches stops for it."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(p.versioned(record), sort_keys=True, separators=(",", ":")) + "\n")
        os.replace(tmp, path)
        return None
    except OSError as exc:
        return exc
