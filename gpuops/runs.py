"""Runs on the target: ids, the run directory and its records, read back by any machine."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

# Shell fragments for paths on the target; "$HOME" is expanded by the target's bash.
STATE_DIR = '"$HOME/.gpuops"'


def new_run_id(now: float | None = None) -> str:
    """Sortable and unique: 20261129-101500-3fa9c2."""
    import secrets

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


def run_dir(run_id: str) -> str:
    """The run directory as a shell word (run ids hold only [0-9a-f-])."""
    _check_id(run_id)
    return f'"$HOME/.gpuops/runs/{run_id}"'


def _check_id(run_id: str) -> None:
    if not run_id or any(c not in "0123456789abcdefghijklmnopqrstuvwxyz-" for c in run_id):
        raise ValueError(f"not a run id: {run_id!r}")


@dataclass
class RunInfo:
    """What the run directory says about one run."""

    run_id: str
    session: str
    meta: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    abort: dict[str, Any] | None = None
    log_size: int | None = None
    log_mtime: float | None = None
    session_alive: bool = False
    remote_now: float | None = None

    @property
    def state(self) -> str:
        """warming | running | exited | aborted | stalled | lost."""
        if self.abort is not None:
            return "stalled" if self.abort.get("reason") == "stall" else "aborted"
        if self.exit_code is not None:
            return "exited"
        if self.session_alive:
            return "running"
        if self.meta.get("phase") in ("preflight", "warmup"):
            return "warming" if self.meta.get("launcher_alive") else "failed-before-start"
        return "lost"

    @property
    def alive(self) -> bool:
        return self.session_alive or self.state == "warming"

    @property
    def seconds_since_log(self) -> float | None:
        if self.log_mtime is None or self.remote_now is None:
            return None
        return max(0.0, self.remote_now - self.log_mtime)

    def outcome_code(self) -> int | None:
        """The exit code gpuops reports for this run once it has ended."""
        from gpuops.errors import ExitCode

        if self.abort is not None:
            return ExitCode.STALLED if self.abort.get("reason") == "stall" else (
                ExitCode.TIMEOUT if self.abort.get("reason") == "timeout" else (
                    ExitCode.TRAINING_FAILED if self.abort.get("reason") == "stop" else ExitCode.ABORTED
                )
            )
        if self.exit_code is not None:
            return ExitCode.OK if self.exit_code == 0 else ExitCode.TRAINING_FAILED
        return None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.run_id,
            "session": self.session,
            "state": self.state,
            "exit_code": self.exit_code,
            "started_at": self.meta.get("started_at"),
            "playbook": self.meta.get("playbook"),
            "seconds_since_log": self.seconds_since_log,
            "log_bytes": self.log_size,
            "abort": self.abort,
            "last_match": (self.abort or {}).get("rule") or self.meta.get("last_match"),
        }


def dumps(record: dict[str, Any]) -> str:
    """A record as one line of JSON (so it can travel inside a shell word)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))
