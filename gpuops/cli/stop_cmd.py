"""`gpuops stop`: abort the current run of each target asked for (signal, grace, kill its session and processes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuops.cli.run_flow import drive, each_target, renderer
from gpuops.cli.junit import NO_REPORT
from gpuops.client.selection import load_plays

if TYPE_CHECKING:
    from gpuops.cli.roles import Render
    from gpuops.client.play import Play


def run_stop(inventory: str | None, playbook: str | None, targets: tuple[str, ...], *, every: bool = False,
             as_json: bool, verbose: bool) -> int:
    plays = load_plays(inventory, playbook, targets, every, need_env=False)
    return each_target(plays, _stop_one, renderer(as_json, verbose, multi=len(plays) > 1), NO_REPORT, as_json=as_json,
                       verbose=verbose)


def _stop_one(play: Play, render: Render) -> int:
    """Stop one target's run."""
    from gpuops.client.launch import stop

    try:
        return drive(stop(play), render, play.target.name, {})
    finally:
        play.transport.close()
