"""Watch a run: follow its log, match signatures, abort on the first abort rule or a stall."""

from __future__ import annotations

import re
import time
from typing import Any, Iterator

from gpuops.errors import ContainerNotRunning, ExitCode
from gpuops.flow.abort import abort_run, reap
from gpuops.flow.events import Event, Outcome
from gpuops.flow.job import Job
from gpuops.follow import Data, Ended, Heartbeat, LogFollower, Reconnected, Reconnecting, Reset


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def build_matcher(job: Job, start_offset: int = 0) -> Any:
    """The built-in library (unless turned off) followed by the playbook's rules."""
    from gpuops.signatures import accel, builtin_rules, regex_rule

    rules = list(builtin_rules()) if job.playbook.watch.builtin else []
    rules += [regex_rule(r.name, r.pattern, r.action) for r in job.playbook.watch.rules]
    return accel.matcher(rules, start_offset=start_offset)


def _hit_data(hit: Any, job: Job) -> dict[str, Any]:
    return {
        "rule": hit.rule,
        "action": hit.action,
        "description": hit.description,
        "line": job.mask(hit.line),
        "line_number": hit.line_number,
        "offset": hit.offset,
        "excerpt": job.mask(hit.excerpt),
    }


def watch(
    job: Job,
    run_id: str,
    *,
    tail: int = -1,
    abort_on_match: bool = True,
    deadline: float | None = None,
    once: bool = False,
) -> Iterator[Event | Outcome]:
    """Yield log and match events; the last item is the Outcome."""
    target = job.target.name
    stall = job.playbook.watch.stall_timeout
    follower = LogFollower(job.transport, run_id, job.session, tail=tail, once=once)
    matcher = None
    first_abort: Any = None
    log_tail = b""  # the log's last bytes: a failed run's outcome quotes its last line
    missing = 0  # heartbeats in a row that found no log file (deleted under the run): counts as no output
    stall_said = False  # --no-abort: a stall is reported once, until the log grows again
    try:
        for ev in follower:
            if isinstance(ev, Data):
                log_tail = (log_tail + ev.data)[-4096:]
                stall_said = False
                if matcher is None:
                    matcher = build_matcher(job, ev.offset)
                yield Event("log", target, run_id, {"offset": ev.offset, "bytes": ev.data})
                if once:
                    continue  # plain `gpuops logs` prints the log; only --follow watches it
                for hit in matcher.feed(ev.data):
                    yield Event("match", target, run_id, _hit_data(hit, job))
                    if hit.action == "abort" and first_abort is None:
                        first_abort = hit
                        if abort_on_match:
                            yield from _abort_events(job, run_id, "match", hit)
                            return
            elif isinstance(ev, Reset):
                matcher = None
                log_tail = b""
                yield Event("log_reset", target, run_id, {"why": ev.why})
            elif isinstance(ev, Heartbeat):
                if deadline is not None and time.monotonic() >= deadline:
                    yield from _timeout(job, run_id)
                    return
                missing = missing + 1 if ev.size == -2 else 0
                if missing == 2:  # not a rotation's brief gap: said once
                    yield Event("log_missing", target, run_id, {"log": f"~/.gpuops/runs/{run_id}/log"})
                if stall > 0 and ev.size != -1 and ev.now - ev.mtime >= stall and not once and not stall_said:
                    note = {"log_missing": True} if ev.size == -2 else {}
                    yield Event("stall", target, run_id, {"seconds": round(ev.now - ev.mtime, 1), "stall_timeout": stall, **note})
                    if abort_on_match:
                        yield from _abort_events(job, run_id, "stall", None, seconds=round(ev.now - ev.mtime, 1),
                                                 last_line=_last_line(log_tail, job), **note)
                        return
                    stall_said = True  # --no-abort never stops the run
            elif isinstance(ev, Reconnecting):
                yield Event("reconnecting", target, run_id, {"error": ev.error, "attempt": ev.attempt})
            elif isinstance(ev, Reconnected):
                yield Event("reconnected", target, run_id, {"offset": ev.offset})
            elif isinstance(ev, Ended):
                if matcher is not None and not once:
                    for hit in matcher.finish():
                        yield Event("match", target, run_id, _hit_data(hit, job))
                        if hit.action == "abort" and first_abort is None:
                            first_abort = hit
                yield from _ended(job, run_id, ev, first_abort, abort_on_match, once, _last_line(log_tail, job))
                return
            if deadline is not None and time.monotonic() >= deadline:
                yield from _timeout(job, run_id)
                return
    finally:
        follower.close()


def _timeout(job: Job, run_id: str) -> Iterator[Event | Outcome]:
    yield Event("timeout", job.target.name, run_id, {})
    result = abort_run(job, run_id, "timeout")
    yield _aborted_event(job, run_id, result)
    yield Outcome("timeout", ExitCode.TIMEOUT, f"--timeout ran out: run {run_id} stopped", {"run": run_id})


def _aborted_event(job: Job, run_id: str, result: Any) -> Event:
    return Event(
        "aborted",
        job.target.name,
        run_id,
        {"reason": result.record["reason"], "survivors": result.survivors, "gpus": result.gpus, "seconds": round(result.seconds, 3),
         "session_gone_at": result.session_gone_at},
    )


def _abort_events(job: Job, run_id: str, reason: str, hit: Any, **extra: Any) -> Iterator[Event | Outcome]:
    yield Event("abort_start", job.target.name, run_id, {"reason": reason, "rule": hit.rule if hit else None})
    result = abort_run(
        job, run_id, reason,
        rule=hit.rule if hit else None,
        line=hit.line if hit else None,
        excerpt=hit.excerpt if hit else None,
        extra=extra,
    )
    yield _aborted_event(job, run_id, result)
    if reason == "stall":
        yield Outcome(
            "stalled", ExitCode.STALLED,
            f"run {run_id} stalled: no log output for {extra.get('seconds')}s (stall_timeout {job.playbook.watch.stall_timeout:g}s"
            + ("; its log file is missing" if extra.get("log_missing") else "") + "); stopped"
            + (f"; last log line: {extra['last_line']}" if extra.get("last_line") else ""),
            {"run": run_id, "rule": "stall", "gpus": result.gpus, "last_line": extra.get("last_line")},
        )
    else:
        yield Outcome(
            "aborted", ExitCode.ABORTED,
            f"run {run_id} aborted: rule '{hit.rule}' matched: {job.mask(hit.line)}",
            {"run": run_id, "rule": hit.rule, "line": job.mask(hit.line), "excerpt": job.mask(hit.excerpt), "gpus": result.gpus},
        )


def _last_line(tail: bytes, job: Job) -> str | None:
    """The log's last non-blank line, colours removed and secrets masked: why a failed run failed, at a glance."""
    for raw in reversed(tail.replace(b"\r", b"\n").split(b"\n")):
        text = _ANSI.sub("", raw.decode("utf-8", "replace")).strip()
        if text:
            return job.mask(text[-300:])
    return None


def _ended(job: Job, run_id: str, ev: Ended, first_abort: Any, abort_on_match: bool, once: bool,
           last_line: str | None = None) -> Iterator[Event | Outcome]:
    target = job.target.name
    said = {"last_line": last_line} if last_line else {}
    last = f"; last log line: {last_line}" if last_line else ""
    if ev.how == "once":
        yield Outcome("printed", ExitCode.OK, "", {"run": run_id})
        return
    if ev.how.startswith("container-"):
        yield _container_lost(job, run_id, ev.how[len("container-"):])
        return
    if ev.how != "abort" and first_abort is not None and abort_on_match:
        # The command exited by itself, but an abort rule matched: that decides the outcome.
        yield from _abort_events(job, run_id, "match", first_abort)
        return
    try:
        survivors = reap(job, run_id)
    except ContainerNotRunning:
        yield _container_lost(job, run_id, "stopped")
        return
    if survivors:
        yield Event("survivors", target, run_id, {"pids": survivors})
    if ev.how == "abort":
        from gpuops.probe import parse_probe, probe_script
        from gpuops.command import bash

        probe = parse_probe(job.run(bash(probe_script((job.session,)))).out)
        state = probe.sessions.get(job.session)
        info = state.run if state and state.run and state.run.run_id == run_id else None
        record = info.abort if info and info.abort else {}
        code = info.outcome_code() if info else ExitCode.ABORTED
        reason = record.get("reason", "abort")
        yield Outcome(
            {"stall": "stalled", "stop": "stopped", "timeout": "timeout"}.get(reason, "aborted"),
            code if code is not None else ExitCode.ABORTED,
            f"run {run_id} was stopped elsewhere ({reason}{': ' + record['rule'] if record.get('rule') else ''})",
            {"run": run_id, "rule": record.get("rule"), "excerpt": record.get("excerpt")},
        )
        return
    if first_abort is not None:
        yield Outcome("matched", ExitCode.ABORTED, f"run {run_id} ended; rule '{first_abort.rule}' matched (not aborted: --no-abort)",
                      {"run": run_id, "rule": first_abort.rule, "excerpt": job.mask(first_abort.excerpt)})
        return
    if ev.how == "gone" or ev.code is None:
        yield Outcome("lost", ExitCode.TRAINING_FAILED,
                      f"run {run_id} ended without an exit code: its tmux session is gone (killed by hand, or the container stopped){last}",
                      {"run": run_id, **said})
        return
    if ev.code == 0:
        yield Outcome("succeeded", ExitCode.OK, f"run {run_id} finished with exit code 0", {"run": run_id, "command_exit_code": 0})
    else:
        yield Outcome("failed", ExitCode.TRAINING_FAILED, f"run {run_id}: training exited with code {ev.code}{_signal_note(ev.code)}{last}",
                      {"run": run_id, "command_exit_code": ev.code, **said})


def _container_lost(job: Job, run_id: str, state: str) -> Outcome:
    """The container stopped (or was destroyed) under the run: nothing of it is left to stop or reap."""
    what = "stopped" if state == "stopped" else "no longer exists"
    return Outcome(
        "lost", ExitCode.TRAINING_FAILED,
        f"run {run_id} is lost: container {job.target.ctid} {what} while it ran "
        "(its tmux session and every process of the run went with it)",
        {"run": run_id, "container": state},
    )


def _signal_note(code: int) -> str:
    names = {129: "SIGHUP: its tmux session was killed", 130: "SIGINT", 137: "SIGKILL", 139: "SIGSEGV", 143: "SIGTERM"}
    return f" ({names[code]})" if code in names else ""
