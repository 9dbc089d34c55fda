"""`gpuops logs`: find the run from the target's run directory and print or follow its log, on each target asked for."""

from __future__ import annotations

import functools
import shlex
import time
from typing import TYPE_CHECKING, Any, Iterator

from gpuops.cli.flows.run_flow import drive, each_target, interrupted_abort, renderer
from gpuops.cli.flows.which_run import check_run_id, pick, recorded_outcome
from gpuops.cli.reports.junit import NO_REPORT
from gpuops.cli.signals import cause_of, code_of, outcome_of
from gpuops.client.events import Event, Outcome
from gpuops.client.selection import load_plays
from gpuops.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from gpuops.agent.wire.runinfo import RunInfo
    from gpuops.cli.roles import Render, Report
    from gpuops.client.play import Play


def current_run(play: Play) -> RunInfo:
    """The session's current run (NoRun, exit 2, when it has none)."""
    info = pick(play, None).info
    assert info is not None  # pick gives the current run, or raises
    return info


def wait_started(play: Play, info: RunInfo, deadline: float | None) -> RunInfo:
    """A launch in progress (preflight, warmup) has no session yet: wait until it starts training or gives up.

    Following it at once would take the missing session for a lost run and reap its warmup.
    """
    while info.state == "warming" and (deadline is None or time.monotonic() < deadline):
        time.sleep(1.0)
        info = current_run(play)
    return info


def run_logs(inventory: str | None, playbook: str | None, targets: tuple[str, ...], *, every: bool = False,
             run_id: str | None = None, follow: bool, tail: int | None, no_abort: bool, timeout: float | None,
             as_json: bool, verbose: bool, report: Report = NO_REPORT) -> int:
    if run_id is not None:
        check_run_id(run_id)
    plays = load_plays(inventory, playbook, targets, every, need_env=False)
    if run_id is not None and len(plays) > 1:
        raise UsageError(f"--run {run_id} is a run of one target: pass one -t (not {', '.join(j.target.name for j in plays)})")
    deadline = time.monotonic() + timeout if (timeout and follow) else None  # one budget for every target
    work = functools.partial(_logs_one, run_id=run_id, follow=follow, tail=tail, no_abort=no_abort, deadline=deadline,
                             inventory=inventory, playbook=playbook)
    job_run = _job_run(plays) if follow and run_id is None else None
    if job_run is not None:  # a torchrun job's nodes: the job's summary and code are the first failing node's
        from gpuops.cli.flows.job_flow import fan_job

        return fan_job(plays, work, job_run, renderer(as_json, verbose, multi=True), report, as_json=as_json,
                       verbose=verbose)
    return each_target(plays, work, renderer(as_json, verbose, multi=len(plays) > 1), report, as_json=as_json,
                       verbose=verbose, ordered=not follow)


def _job_run(plays: list[Play]) -> str | None:
    """The run id of the torchrun job these plays are the nodes of (node 0's current run); None for other plays, or
    where node 0 cannot say (each node is then followed as a target is)."""
    from gpuops.client.nodes import is_job
    from gpuops.errors import GpuopsError

    if len(plays) < 2 or not is_job(plays):
        return None
    try:
        info = current_run(plays[0])
    except GpuopsError:
        return None
    return info.run_id if (info.meta.get("job") or {}).get("id") == info.run_id else None


def _logs_one(play: Play, render: Render, *, run_id: str | None, follow: bool, tail: int | None, no_abort: bool,
              deadline: float | None, inventory: str | None, playbook: str | None) -> int:
    """One target's log, printed or followed."""
    from gpuops.client.view.viewer import view

    state: dict[str, Any] = {"started": True}
    tail_at = -1 if tail is None else tail
    try:
        picked = pick(play, run_id)
        if picked.row is not None:
            return _earlier_run(play, render, picked.row, follow=follow, tail=tail_at, state=state)
        info = picked.info
        assert info is not None  # pick gives an earlier run's row, or the current run
        if follow and info.state == "warming":
            render.event(Event("waiting_start", play.target.name, info.run_id, {"phase": info.meta.get("phase")}))
            info = wait_started(play, info, deadline)
            phase = info.meta.get("phase")
            if info.state != "warming" and phase != "running":
                code = ExitCode.WARMUP if phase == "warmup-failed" else ExitCode.TRAINING_FAILED
                render.outcome(Outcome("not-started", code, f"run {info.run_id} never started: its launch ended in phase '{phase}'",
                                       {"run": info.run_id}), play.target.name)
                return code
        events = view(play, info.run_id, tail=tail_at, abort_on_match=follow and not no_abort, deadline=deadline,
                       once=not follow)
        if follow:
            render.event(Event("following", play.target.name, info.run_id, {"state": info.state}))
        return drive(events, render, play.target.name, state)
    except KeyboardInterrupt as exc:
        if state.get("aborting"):
            outcome = interrupted_abort(play, state, inventory, playbook, exc)
        else:
            how = shlex.join(["gpuops", "logs", "-f", "-i", str(inventory), "-p", str(playbook), "-t", play.target.name])
            outcome = Outcome(outcome_of(exc), code_of(exc),
                              f"{cause_of(exc)}: stopped following; the run is still alive in tmux session '{play.session}'. "
                              f"Reattach with: {how}", {"run": state.get("run"), "run_alive": True})
        render.outcome(outcome, play.target.name)
        return outcome.exit_code
    finally:
        play.transport.close()


def _earlier_run(play: Play, render: Render, row: dict[str, Any], *, follow: bool, tail: int, state: dict[str, Any]) -> int:
    """`--run ID` of a run that is over: its log; with --follow, then the code it ended with."""
    from gpuops.client.view.viewer import view

    run_id = row["run"]
    events = view(play, run_id, tail=tail, abort_on_match=False, once=True)
    if not follow:
        return drive(events, render, play.target.name, state)
    render.event(Event("following", play.target.name, run_id, {"state": row.get("outcome")}))
    return drive(_ending_with(events, recorded_outcome(row)), render, play.target.name, state)


def _ending_with(events: Iterator[Event | Outcome], outcome: Outcome) -> Iterator[Event | Outcome]:
    """The log's events, then `outcome` in place of the print's own."""
    try:
        for item in events:
            if isinstance(item, Outcome):
                yield outcome
                return
            yield item
    finally:
        close = getattr(events, "close", None)
        if close:
            close()
