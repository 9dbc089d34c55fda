"""--junit and --report on one command: the one Report the flows and the fan-out are given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuops.cli.reports.html.writer import HtmlReport
from gpuops.cli.reports.junit import Report, Suite

if TYPE_CHECKING:
    from gpuops.cli.roles import Render
    from gpuops.client.play import Play


class Reports:
    """--junit and --report together, as each_target and the fan-out use one report object."""

    def __init__(self, junit: Report, html: HtmlReport) -> None:
        self.junit, self.html = junit, html

    @property
    def path(self) -> str | None:
        return self.junit.path

    def suite(self, name: str) -> Suite:
        return self.junit.suite(name)

    def wrap(self, render: Render, play: Play) -> Render:
        return self.html.wrap(self.junit.wrap(render, play), play)
