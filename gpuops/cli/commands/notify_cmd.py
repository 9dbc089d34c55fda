"""`gpuops notify-test`: a test payload through every `notify:` channel of the playbook, sent from each target
asked for; prints what each channel answered; exit 9 when any failed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuops.cli.flows.run_flow import drive, each_target, renderer
from gpuops.cli.reports.junit import NO_REPORT
from gpuops.client.selection import load_plays

if TYPE_CHECKING:
    from gpuops.cli.roles import Render
    from gpuops.client.play import Play


def run_notify_test(inventory: str | None, playbook: str | None, targets: tuple[str, ...], *, as_json: bool,
                    verbose: bool) -> int:
    plays = load_plays(inventory, playbook, targets, need_env=True)
    return each_target(plays, _one, renderer(as_json, verbose, multi=len(plays) > 1), NO_REPORT, as_json=as_json,
                       verbose=verbose)


def _one(play: Play, render: Render) -> int:
    from gpuops.client.notifications import notify_test

    try:
        return drive(notify_test(play), render, play.target.name, {})
    finally:
        play.transport.close()
