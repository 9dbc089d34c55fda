"""Click option types: a value click would take but gpuops cannot use is a usage error (exit 2)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # click 8.3 made ParamType generic in the value it makes; older clicks (>= 8.1) cannot subscript it
    _FloatParam = click.ParamType[float]
else:
    _FloatParam = click.ParamType


class Seconds(_FloatParam):
    """A positive, finite number of seconds: click's float takes 'nan' and 'inf', which never fire."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a positive, finite number of seconds", param, ctx)
        return seconds
