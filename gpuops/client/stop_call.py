"""Stop a run from here: the target's one abort sequence (gpuops/agent/run/abort.py), through the transport.

The first to claim a run's abort (the watchdog, this client, `gpuops stop`, `--timeout`) stops it;
everyone else is told who did and waits for the end. The sequence runs on the target and survives
a dropped connection; the call is repeated through reconnects until it reports the end.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from gpuops.command import Cmd
from gpuops.errors import AuthError, CommandTimeout, ConnectError, HostKeyError
from gpuops.client import tools
from gpuops.client.job import Job
from gpuops.agent.wire import protocol as p
from gpuops.transport.base import Result

ABORT_PERSISTENCE = 300.0  # seconds an abort keeps trying through a lost connection


@dataclass
class AbortResult:
    record: dict[str, Any]  # the record in force: ours, or the one who stopped the run first
    won: bool = True  # False: someone else had already claimed the abort
    survivors: list[int] = field(default_factory=list)
    held_by: dict[str, list[int]] = field(default_factory=dict)  # GPU -> pids, for a GPU that did not drain
    gpus: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    session_gone_at: float | None = None  # the target's clock

    @property
    def by(self) -> str | None:
        return self.record.get("by")


def run_persistently(job: Job, cmd: Cmd, *, timeout: float, stdin: bytes | None = None,
                     budget: float = ABORT_PERSISTENCE) -> Result:
    """Run an idempotent command (abort, reap) through dropped connections: a run must not
    survive because the link blinked between the match and the abort. Host-key and
    authentication errors are not retried."""
    deadline = time.monotonic() + budget
    while True:
        try:
            return job.run(cmd, timeout=timeout, stdin=stdin)
        except (ConnectError, CommandTimeout) as exc:
            if isinstance(exc, (HostKeyError, AuthError)) or time.monotonic() >= deadline:
                raise
            time.sleep(1.0)  # the next run() reconnects, retrying transient errors itself


def abort_record(job: Job, reason: str, *, rule: str | None = None, line: str | None = None,
                 excerpt: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Why a run is stopped, with secrets masked (before any cut): written to abort.json on the target."""
    ab = job.playbook.abort
    return {
        "reason": reason,
        "rule": rule,
        "line": job.mask(line) if line else None,
        "excerpt": job.mask(excerpt) if excerpt else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "signal": ab.signal,
        "grace": ab.grace,
        **(extra or {}),
    }


def abort_run(job: Job, run_id: str, reason: str, *, by: str = "client", rule: str | None = None,
              line: str | None = None, excerpt: str | None = None, extra: dict[str, Any] | None = None) -> AbortResult:
    """Claim the run's abort and stop it the way the playbook says; returns what was left (or who won)."""
    record = abort_record(job, reason, rule=rule, line=line, excerpt=excerpt, extra=extra)
    stdin = json.dumps(record).encode()
    result = run_persistently(job, tools.abort(run_id, by), timeout=job.playbook.abort.grace + 150.0, stdin=stdin)
    out = AbortResult({**record, "by": by})
    said = p.parse_abort(result.out)
    if said.already is not None:
        out.won = False
        out.record = said.already
    if said.done is not None:
        done = said.done
        out.survivors = [int(x) for x in done.get("survivors") or [] if isinstance(x, int)]
        out.gpus = list(done.get("gpus") or [])
        out.held_by = {str(g): [int(x) for x in pids if isinstance(x, int)]
                       for g, pids in (done.get("held_by") or {}).items() if isinstance(pids, list)}
        out.seconds = float(done.get("seconds") or 0.0)
        out.session_gone_at = done.get("session_gone_at")
    return out


def reap(job: Job, run_id: str, *, persistent: bool = True, budget: float = ABORT_PERSISTENCE) -> list[int]:
    """Kill every process of the run that is left (workers that outlived the command, a warmup);
    returns those that survived SIGKILL. `persistent` keeps trying through a dropped connection
    (for `budget` seconds)."""
    cmd = tools.reap(run_id)
    timeout = max(job.timeout, 30.0)
    result = (run_persistently(job, cmd, timeout=timeout, budget=budget) if persistent
              else job.run(cmd, timeout=timeout))
    return p.parse_kill_marked(result.out)
