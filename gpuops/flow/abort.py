"""Abort a run: signal its foreground job, wait the grace, kill the session and every process of the run."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gpuops.command import Cmd, bash
from gpuops.errors import AuthError, CommandTimeout, ConnectError, HostKeyError
from gpuops.transport.base import Result
from gpuops.flow.job import Job, holder_id
from gpuops.flow.scripts import MARK, abort_script, kill_marked_script
from gpuops.gpus import SmiError, parse_gpus
from gpuops.runs import dumps


@dataclass
class AbortResult:
    record: dict[str, Any]
    survivors: list[int] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    session_gone_at: float | None = None  # the target's clock


ABORT_PERSISTENCE = 300.0  # seconds an abort keeps trying through a lost connection


def run_persistently(job: Job, cmd: Cmd, *, timeout: float, budget: float = ABORT_PERSISTENCE) -> Result:
    """Run an idempotent command (abort, reap) through dropped connections: a run must not
    survive because the link blinked between the match and the abort. Host-key and
    authentication errors are not retried."""
    deadline = time.monotonic() + budget
    while True:
        try:
            return job.run(cmd, timeout=timeout)
        except (ConnectError, CommandTimeout) as exc:
            if isinstance(exc, (HostKeyError, AuthError)) or time.monotonic() >= deadline:
                raise
            time.sleep(1.0)  # the next run() reconnects, retrying transient errors itself


def abort_record(job: Job, reason: str, *, rule: str | None = None, line: str | None = None,
                 excerpt: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Why a run was stopped, with secrets masked: written to abort.json."""
    ab = job.playbook.abort
    return {
        "reason": reason,
        "rule": rule,
        "line": job.mask(line) if line else None,
        "excerpt": job.mask(excerpt) if excerpt else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "signal": ab.signal,
        "grace": ab.grace,
        "by": holder_id(),
        **(extra or {}),
    }


def abort_run(job: Job, run_id: str, reason: str, *, rule: str | None = None, line: str | None = None,
              excerpt: str | None = None, extra: dict[str, Any] | None = None) -> AbortResult:
    """Stop the run the way the playbook says and write the abort record; returns what was left."""
    ab = job.playbook.abort
    record = abort_record(job, reason, rule=rule, line=line, excerpt=excerpt, extra=extra)
    script = abort_script(
        job.session, run_id, ab.signal, ab.grace, dumps(record), job.run_gpus,
        job.playbook.preflight.max_memory_used_mib,
    )
    started = time.monotonic()
    result = run_persistently(job, bash(script), timeout=ab.grace + 90.0)
    out = AbortResult(record, seconds=time.monotonic() - started)
    for text in result.out.splitlines():
        if text.startswith(MARK + "survivors"):
            out.survivors = [int(p) for p in text.split()[2:] if p.isdigit()]
        elif text.startswith(MARK + "session-gone "):
            try:
                out.session_gone_at = float(text.split()[2])
            except (IndexError, ValueError):
                pass
        elif text.startswith(MARK + "gpus "):
            rows = text[len(MARK) + 5 :].replace(";", "\n")
            try:
                out.gpus = [g.as_json() for g in parse_gpus(rows)]
            except (SmiError, ValueError):
                out.gpus = []
    return out


def reap(job: Job, run_id: str, *, persistent: bool = True) -> list[int]:
    """Kill every process of the run that is left (workers that outlived the command, a warmup);
    returns those that survived SIGKILL. `persistent` keeps trying through a dropped connection."""
    cmd = bash(kill_marked_script(f"GPUOPS_RUN_ID={run_id}"))
    timeout = max(job.timeout, 30.0)
    result = run_persistently(job, cmd, timeout=timeout) if persistent else job.run(cmd, timeout=timeout)
    for text in result.out.splitlines():
        if text.startswith(MARK + "survivors"):
            return [int(p) for p in text.split()[2:] if p.isdigit()]
    return []
