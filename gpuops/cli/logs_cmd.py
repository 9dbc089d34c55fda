"""`gpuops logs` and `gpuops stop`: find the current run from the target's run directory."""

from __future__ import annotations

import shlex
import time
from typing import Any

from gpuops.cli.common import load_job, report_cost
from gpuops.cli.drive import drive, interrupted_abort, renderer
from gpuops.cli.junit import NO_REPORT
from gpuops.errors import ExitCode, NoRun
from gpuops.flow.events import Event, Outcome


def current_run(job: Any) -> Any:
    from gpuops.flow.outcome import session_state

    state = session_state(job)
    if state is None or state.run is None:
        raise NoRun(f"{job.target.name}: no run of '{job.session}' found in ~/.gpuops", hint="start one with `gpuops launch`")
    return state.run


def wait_started(job: Any, info: Any, deadline: float | None) -> Any:
    """A launch in progress (preflight, warmup) has no session yet: wait until it starts training or gives up.

    Following it at once would take the missing session for a lost run and reap its warmup.
    """
    while info.state == "warming" and (deadline is None or time.monotonic() < deadline):
        time.sleep(1.0)
        info = current_run(job)
    return info


def run_logs(inventory: str | None, playbook: str | None, target: str | None, *, follow: bool, tail: int | None,
             no_abort: bool, timeout: float | None, as_json: bool, verbose: bool, report: Any = NO_REPORT) -> int:
    from gpuops.flow.watch import watch

    job = load_job(inventory, playbook, target, need_env=False)
    render = report.wrap(renderer(as_json, verbose), job)  # --junit records what is rendered
    state: dict[str, Any] = {"started": True}
    try:
        info = current_run(job)
        deadline = time.monotonic() + timeout if (timeout and follow) else None
        if follow and info.state == "warming":
            render.event(Event("waiting_start", job.target.name, info.run_id, {"phase": info.meta.get("phase")}))
            info = wait_started(job, info, deadline)
            phase = info.meta.get("phase")
            if info.state != "warming" and phase != "running":
                code = ExitCode.WARMUP if phase == "warmup-failed" else ExitCode.TRAINING_FAILED
                render.outcome(Outcome("not-started", code, f"run {info.run_id} never started: its launch ended in phase '{phase}'",
                                       {"run": info.run_id}), job.target.name)
                return code
        events = watch(job, info.run_id, tail=-1 if tail is None else tail, abort_on_match=follow and not no_abort,
                       deadline=deadline, once=not follow)
        if follow:
            render.event(Event("following", job.target.name, info.run_id, {"state": info.state}))
        return drive(events, render, job.target.name, state)
    except KeyboardInterrupt:
        if state.get("aborting"):
            render.outcome(interrupted_abort(job, state, inventory, playbook), job.target.name)
            return ExitCode.INTERRUPTED
        how = shlex.join(["gpuops", "logs", "-f", "-i", str(inventory), "-p", str(playbook), "-t", job.target.name])
        render.outcome(Outcome("interrupted", ExitCode.INTERRUPTED,
                               f"stopped following; the run is still alive in tmux session '{job.session}'. Reattach with: {how}",
                               {"run": state.get("run"), "run_alive": True}), job.target.name)
        return ExitCode.INTERRUPTED
    finally:
        report_cost(verbose, [job.transport])
        job.transport.close()


def run_stop(inventory: str | None, playbook: str | None, target: str | None, *, as_json: bool, verbose: bool) -> int:
    from gpuops.flow.launch import stop

    job = load_job(inventory, playbook, target, need_env=False)
    try:
        return drive(stop(job), renderer(as_json, verbose), job.target.name, {})
    finally:
        report_cost(verbose, [job.transport])
        job.transport.close()
