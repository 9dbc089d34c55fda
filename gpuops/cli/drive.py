"""Drive a core generator: render each event, return the outcome's exit code."""

from __future__ import annotations

from typing import Any, Iterator

from gpuops.errors import GpuopsError
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
