"""`gpuops launch`: confirm, run the flow on each target, and say how to reattach after Ctrl-C, SIGTERM or SIGHUP
(or, with --stop-on-exit, stop the run first: a cancelled CI job leaves no run behind)."""

from __future__ import annotations

import functools
import shlex
import sys
from typing import TYPE_CHECKING, Any

from gpuops.cli.flows.run_flow import drive, each_target, interrupted_abort, renderer
from gpuops.cli.reports.junit import NO_REPORT
from gpuops.cli.signals import cause_of, code_of, outcome_of, signals_deferred
from gpuops.client.events import Event, Outcome
from gpuops.client.selection import load_plays
from gpuops.errors import ExitCode, GpuopsError

if TYPE_CHECKING:
    from gpuops.cli.roles import Render, Report
    from gpuops.client.play import Play


def run_launch(inventory: str | None, playbook: str | None, targets: tuple[str, ...], *, every: bool = False,
               detach: bool, dry_run: bool, yes: bool, timeout: float | None, as_json: bool, verbose: bool,
               report: Report = NO_REPORT, stop_on_exit: bool = False) -> int:
    if dry_run:
        from gpuops.cli.flows.dry_run import dry_run as print_dry_run

        return print_dry_run(inventory, playbook, targets, every, as_json)
    plays = load_plays(inventory, playbook, targets, every)
    from gpuops.cli.flows.job_flow import run_job
    from gpuops.client.nodes import is_job

    if not (yes or as_json) and sys.stdin.isatty() and sys.stderr.isatty():
        import click

        play = plays[0]
        gpus = ", ".join(map(str, play.run_gpus)) or "none"
        where = ", ".join(j.target.name for j in plays)
        if not click.confirm(f"Launch '{play.playbook.name}' on {where} (GPUs {gpus}, session '{play.session}')?",
                             default=True, err=True):
            return ExitCode.OK
    if is_job(plays):
        return run_job(plays, detach=detach, timeout=timeout, as_json=as_json, verbose=verbose, report=report)
    work = functools.partial(_launch_one, detach=detach, timeout=timeout, inventory=inventory, playbook=playbook,
                             stop_on_exit=stop_on_exit)
    return each_target(plays, work, renderer(as_json, verbose, multi=len(plays) > 1), report, as_json=as_json,
                       verbose=verbose)


def _launch_one(play: Play, render: Render, *, detach: bool, timeout: float | None, inventory: str | None,
                playbook: str | None, stop_on_exit: bool = False) -> int:
    """One target's launch, rendered by `render` (the terminal, or the relay of a several-target launch)."""
    from gpuops.client.launch.launch import launch

    state: dict[str, Any] = {}
    try:
        return drive(launch(play, detach=detach, timeout=timeout), render, play.target.name, state)
    except KeyboardInterrupt as exc:
        return _interrupted(play, state, render, inventory, playbook, exc, stop_on_exit)
    except GpuopsError as exc:
        if stop_on_exit and state.get("started") and exc.exit_code == ExitCode.CONNECT:
            _stop_given_up(play, state, render, exc)
        raise
    except BrokenPipeError:  # nobody reads the output any more: stop the run, say nothing
        if stop_on_exit and state.get("started"):
            with signals_deferred():
                _stop(play, _Silent())
        raise
    finally:
        play.transport.close()


class _Silent:
    """A renderer that shows nothing (stdout's reader is gone)."""

    def event(self, ev: Event) -> None:
        pass

    def outcome(self, out: Outcome, target: str | None = None) -> None:
        pass


def _stop(play: Play, render: Render) -> Outcome:
    """`gpuops stop`'s stop of the target's run, its events rendered; its outcome returned, not shown."""
    from gpuops.client.launch.launch import stop

    for item in stop(play):
        if isinstance(item, Outcome):
            return item
        render.event(item)
    return Outcome("stopped", ExitCode.OK, "stopped", {})


def _stop_given_up(play: Play, state: dict[str, Any], render: Render, exc: GpuopsError) -> None:
    """The connection was given up on while following: --stop-on-exit tries the stop through a new one."""
    with signals_deferred():
        try:
            said = _stop(play, render).message
            exc.hint = f"--stop-on-exit: {said}" + (f"; {exc.hint}" if exc.hint else "")
        except GpuopsError as again:
            exc.hint = (f"--stop-on-exit could not stop run {state.get('run')} ({again}); it may still be alive: "
                        "run `gpuops stop` once the target can be reached" + (f"; {exc.hint}" if exc.hint else ""))


def _interrupted(play: Play, state: dict[str, Any], render: Render, inventory: str | None, playbook: str | None,
                 exc: BaseException, stop_on_exit: bool = False) -> int:
    code, name, cause = code_of(exc), outcome_of(exc), cause_of(exc)
    if stop_on_exit and (state.get("started") or state.get("aborting")):
        outcome = _stopped_on_exit(play, state, render, inventory, playbook, exc)
    elif state.get("aborting"):
        outcome = interrupted_abort(play, state, inventory, playbook, exc)
    elif state.get("started"):
        how = shlex.join(["gpuops", "logs", "-f", "-i", str(inventory), "-p", str(playbook), "-t", play.target.name])
        msg = (f"{cause}: stopped following; run {state.get('run')} is still alive in tmux session '{play.session}' "
               f"(its watchdog guards it). Reattach with: {how}")
        outcome = Outcome(name, code, msg, {"run": state.get("run"), "run_alive": True})
    else:
        msg = f"{cause} before the run started: the warmup was stopped, training was not started, the lock released"
        outcome = Outcome(name, code, msg, {"run": state.get("run"), "run_alive": False})
    render.outcome(outcome, play.target.name)
    return code


def _stopped_on_exit(play: Play, state: dict[str, Any], render: Render, inventory: str | None, playbook: str | None,
                     exc: BaseException) -> Outcome:
    """--stop-on-exit: launch is ending before its run, so the run is stopped first (as `gpuops stop` does);
    a further signal meanwhile waits for the stop, which is what it asks for."""
    code, name, cause = code_of(exc), outcome_of(exc), cause_of(exc)
    run = state.get("run")
    with signals_deferred():
        try:
            stopped = _stop(play, render)
        except GpuopsError as err:
            how = shlex.join(["gpuops", "stop", "-i", str(inventory), "-p", str(playbook), "-t", play.target.name])
            return Outcome(name, code, f"{cause}: --stop-on-exit could not stop run {run} ({err}); it may still be "
                           f"alive: run {how}", {"run": run, "run_alive": None})
    return Outcome(name, code, f"{cause}: --stop-on-exit: {stopped.message}", {"run": run, "run_alive": False})
