"""Stop a run from here: the target's one abort sequence (gpuops/agent/run/abort.py), through the door.

The first to claim a run's abort (the watchdog, this client, `gpuops stop`, `--timeout`) stops it;
everyone else is told who did and waits for the end. The sequence runs on the target and survives
a dropped connection; the door repeats the call through reconnects until it reports the end.
"""

from __future__ import annotations

import time
from typing import Any

from gpuops.agent.wire.protocol import AbortReply
from gpuops.client.play import Play

__all__ = ["abort_record", "abort_run"]


def abort_record(play: Play, reason: str, *, rule: str | None = None, line: str | None = None,
                 excerpt: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Why a run is stopped, with secrets masked (before any cut): written to abort.json on the target."""
    ab = play.playbook.abort
    return {
        "reason": reason,
        "rule": rule,
        "line": play.mask(line) if line else None,
        "excerpt": play.mask(excerpt) if excerpt else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "signal": ab.signal,
        "grace": ab.grace,
        **(extra or {}),
    }


def abort_run(play: Play, run_id: str, reason: str, *, by: str = "client", rule: str | None = None,
              line: str | None = None, excerpt: str | None = None, extra: dict[str, Any] | None = None) -> AbortReply:
    """Claim the run's abort and stop it the way the playbook says; returns what was left (or who won)."""
    record = abort_record(play, reason, rule=rule, line=line, excerpt=excerpt, extra=extra)
    return play.door.abort(run_id, by, record, timeout=play.playbook.abort.grace + 150.0)
