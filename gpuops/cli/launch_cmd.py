"""`gpuops launch`: confirm, run the flow, and say how to reattach after Ctrl-C."""

from __future__ import annotations

import shlex
import sys
from typing import Any

from gpuops.cli.common import load_job, report_cost
from gpuops.cli.drive import drive, interrupted_abort, renderer
from gpuops.cli.junit import NO_REPORT
from gpuops.errors import ExitCode
from gpuops.flow.events import Outcome


def run_launch(inventory: str | None, playbook: str | None, target: str | None, *, detach: bool, dry_run: bool,
               yes: bool, timeout: float | None, as_json: bool, verbose: bool, report: Any = NO_REPORT) -> int:
    if dry_run:
        return _dry_run(inventory, playbook, target, as_json)
    job = load_job(inventory, playbook, target)
    render = report.wrap(renderer(as_json, verbose), job)  # --junit records what is rendered
    if not (yes or as_json) and sys.stdin.isatty() and sys.stderr.isatty():
        import click

        gpus = ", ".join(map(str, job.run_gpus)) or "none"
        if not click.confirm(f"Launch '{job.playbook.name}' on {job.target.name} (GPUs {gpus}, session '{job.session}')?",
                             default=True, err=True):
            return ExitCode.OK
    from gpuops.flow.launch import launch

    state: dict[str, Any] = {}
    try:
        return drive(launch(job, detach=detach, timeout=timeout), render, job.target.name, state)
    except KeyboardInterrupt:
        return _interrupted(job, state, render, inventory, playbook)
    finally:
        report_cost(verbose, [job.transport])
        job.transport.close()


def _interrupted(job: Any, state: dict[str, Any], render: Any, inventory: str | None, playbook: str | None) -> int:
    if state.get("aborting"):
        outcome = interrupted_abort(job, state, inventory, playbook)
    elif state.get("started"):
        how = shlex.join(["gpuops", "logs", "-f", "-i", str(inventory), "-p", str(playbook), "-t", job.target.name])
        msg = f"stopped following; run {state.get('run')} is still alive in tmux session '{job.session}'. Reattach with: {how}"
        outcome = Outcome("interrupted", ExitCode.INTERRUPTED, msg, {"run": state.get("run"), "run_alive": True})
    else:
        msg = "interrupted before the run started: the warmup was stopped, training was not started, the lock released"
        outcome = Outcome("interrupted", ExitCode.INTERRUPTED, msg, {"run": state.get("run"), "run_alive": False})
    render.outcome(outcome, job.target.name)
    return ExitCode.INTERRUPTED


def _dry_run(inventory: str | None, playbook: str | None, target: str | None, as_json: bool) -> int:
    from gpuops.flow.launch import plan

    job = load_job(inventory, playbook, target, dry=True)
    host = job.inventory.hosts[job.target.host]
    if host.transport == "local":
        where = "this machine (local), each command executed as argv without a login shell:"
    else:
        user = f"{host.user}@" if host.user else ""
        port = f" -p {host.port}" if host.port else ""
        jump = f" -J {host.jump}" if host.jump else ""
        where = f"ssh {user}{host.address or host.name}{port}{jump}, each line below sent as the remote command:"
    steps = plan(job)
    if as_json:
        import time

        from gpuops.cli.render import JsonRenderer, iso

        out = JsonRenderer()
        for name, text, stdin in steps:
            out.emit({"ts": iso(time.time()), "event": "dry_run_step", "target": job.target.name, "step": name,
                      "command": text, **({"stdin": stdin} if stdin is not None else {})})
        out.outcome(Outcome("dry-run", ExitCode.OK, "nothing was run", {}), job.target.name)
        return ExitCode.OK
    print(f"# gpuops launch --dry-run: target {job.target.name} via {where}")
    for name, text, stdin in steps:
        print(f"\n# {name}")
        print(text)
        if stdin is not None:
            print(f"# stdin: {stdin}")
    return ExitCode.OK
