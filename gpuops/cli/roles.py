"""The parts the CLI's pieces play for each other, as types: a Render (what a command's events and outcome are
shown through: the terminal's renderer, a worker's relay, a report's tee) and a Report (what wraps a render
to record it: --junit, --report, or neither). Named here so the commands, the flows and the fan-out say what
they pass, where each took `Any`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Union

if TYPE_CHECKING:
    from gpuops.cli.junit import Suite
    from gpuops.cli.render import JsonRenderer, TextRenderer
    from gpuops.client.events import Event, Outcome
    from gpuops.client.play import Play

#: The terminal's renderer (run_flow.renderer): JSON lines with --json, else text.
Terminal = Union["JsonRenderer", "TextRenderer"]


class Render(Protocol):
    """Shows one target's events and the outcome that ends them."""

    def event(self, ev: Event) -> None: ...

    def outcome(self, out: Outcome, target: str | None = None) -> None: ...


class Report(Protocol):
    """Records what is rendered for each play (or records nothing: junit.NO_REPORT)."""

    @property
    def path(self) -> str | None: ...

    def wrap(self, render: Render, play: Play) -> Render: ...

    def suite(self, name: str) -> Suite: ...
