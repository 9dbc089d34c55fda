"""Drive a core generator: render each event, return the outcome's exit code."""

from __future__ import annotations

import shlex
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator

from gpuops.client.events import Event, Outcome
from gpuops.errors import GpuopsError

if TYPE_CHECKING:
    from gpuops.cli.roles import Render, Report, Terminal
    from gpuops.client.play import Play


def renderer(as_json: bool, verbose: bool = False, *, multi: bool = False) -> Terminal:
    """The terminal's renderer; multi: several targets (JSON summaries last, text lines prefixed)."""
    from gpuops.cli.renderers.render import JsonRenderer, TextRenderer

    return JsonRenderer(hold_summaries=multi) if as_json else TextRenderer(verbose=verbose, multi=multi)


def each_target(plays: list[Play], work: Callable[[Play, Render], int], render: Terminal, report: Report, *, as_json: bool,
                verbose: bool, ordered: bool = False) -> int:
    """Run `work(play, renderer)` for every play: one here, as it always ran; several at once (fanout.py),
    the exit code the worst of theirs. `ordered`: each target's output whole, one after another."""
    from gpuops.cli.options import report_cost

    if len(plays) == 1:
        try:
            return work(plays[0], report.wrap(render, plays[0]))  # --junit records what is rendered
        finally:
            report_cost(verbose, [plays[0].transport])
    from gpuops.cli.flows.fanout import Fanout

    fan = Fanout(plays, lambda play: report.wrap(render, play), render, report, as_json=as_json, ordered=ordered)
    try:
        return fan.run(work)
    finally:
        if verbose:
            conns, cmds = fan.cost()
            sys.stderr.write(f"gpuops: {conns} SSH connection(s), {cmds} remote command(s)\n")


def drive(events: Iterator[Event | Outcome], render: Render, target: str, state: dict[str, Any]) -> int:
    """Render events until the Outcome; `state` records the run id and whether it started."""
    try:
        for item in events:
            if isinstance(item, Outcome):
                render.outcome(item, target)
                return item.exit_code
            if item.run:
                state["run"] = item.run
            if item.kind in ("started", "following"):
                state["started"] = True
            elif item.kind == "abort_start":
                state["aborting"] = True
            elif item.kind == "restart":  # that abort ended an attempt; the next one is healthy until one begins
                state["aborting"] = False
            render.event(item)
    except GpuopsError as exc:
        # The boundary reports it: its JSON summary names the target and the run, as every event does.
        exc.target = exc.target or target
        exc.run = exc.run or state.get("run")
        raise
    finally:
        close = getattr(events, "close", None)
        if close:
            close()
    return 1


def interrupted_abort(play: Play, state: dict[str, Any], inventory: str | None, playbook: str | None,
                      exc: BaseException | None = None) -> Outcome:
    """Ctrl-C (or SIGTERM) while a run was being stopped: the target may still be at it; `gpuops stop` makes sure."""
    from gpuops.cli.signals import cause_of, code_of, outcome_of

    exc = exc or KeyboardInterrupt()
    how = shlex.join(["gpuops", "stop", "-i", str(inventory), "-p", str(playbook), "-t", play.target.name])
    return Outcome(outcome_of(exc), code_of(exc),
                   f"{cause_of(exc)} while stopping run {state.get('run')}; to make sure it is stopped, run: {how}",
                   {"run": state.get("run"), "run_alive": None})
