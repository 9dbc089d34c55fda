"""How gpuops' own words look, set once per command: -q (errors and the outcome only) and NO_COLOR."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

#: -q/--quiet: gpuops' notes, progress and events are not shown; errors and the final outcome are.
#: The command's own output on stdout (a log, a table, --json lines) is the same either way.
QUIET = False


def plain() -> bool:
    """NO_COLOR (https://no-color.org: set and not empty): no ANSI styles at all, bold and underline included."""
    return os.environ.get("NO_COLOR", "") != ""


def console(**options: Any) -> Console:
    """A rich Console that honours NO_COLOR fully (rich's own no_color drops colours but keeps bold)."""
    from rich.console import Console

    if plain():
        options.setdefault("color_system", None)
    return Console(**options)
