"""Drive a core generator: render each event, return the outcome's exit code."""

from __future__ import annotations

import shlex
from typing import Any, Iterator

from gpuops.errors import ExitCode, GpuopsError
from gpuops.flow.events import Event, Outcome


def renderer(as_json: bool, verbose: bool = False) -> Any:
    from gpuops.cli.render import JsonRenderer, TextRenderer

    return JsonRenderer() if as_json else TextRenderer(verbose=verbose)


def drive(events: Iterator[Event | Outcome], render: Any, target: str, state: dict[str, Any]) -> int:
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
            render.event(item)
    except GpuopsError as exc:
        # The boundary reports it: its JSON summary names the target and the run, as every event does.
        exc.target = getattr(exc, "target", None) or target
        exc.run = getattr(exc, "run", None) or state.get("run")
        raise
    finally:
        close = getattr(events, "close", None)
        if close:
            close()
    return 1


def interrupted_abort(job: Any, state: dict[str, Any], inventory: str | None, playbook: str | None) -> Outcome:
    """Ctrl-C while a run was being stopped: the target may still be at it; `gpuops stop` makes sure."""
    how = shlex.join(["gpuops", "stop", "-i", str(inventory), "-p", str(playbook), "-t", job.target.name])
    return Outcome("interrupted", ExitCode.INTERRUPTED,
                   f"interrupted while stopping run {state.get('run')}; to make sure it is stopped, run: {how}",
                   {"run": state.get("run"), "run_alive": None})
