"""Sparklines for `gpuops status`: a GPU's memory over the last minutes in one line of block characters.

Flat memory is what a healthy compiled run looks like (1443 MiB, one distinct value in 70 samples
on the H200 of REFERENCE.md); a swing of thousands of MiB is the eager path allocating per step.
The line shows that at a glance; `shape` names it for --json and for terminals without colour.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuops.agent.wire.samples import Sample

BLOCKS = "▁▂▃▄▅▆▇█"
FLAT = "flat"
VOLATILE = "volatile"


def _resample(values: Sequence[float | None], width: int) -> list[float | None]:
    """At most `width` points; a bucket shows its most unusual value, so swings and spikes are not averaged away."""
    if len(values) <= width:
        return list(values)
    known = sorted(v for v in values if v is not None)
    middle = known[len(known) // 2] if known else 0.0
    out: list[float | None] = []
    for i in range(width):
        bucket = [v for v in values[i * len(values) // width:(i + 1) * len(values) // width] if v is not None]
        out.append(max(bucket, key=lambda v: abs(v - middle)) if bucket else None)
    return out


def sparkline(values: Sequence[float | None], width: int = 30, *, min_span: float = 0.0) -> str:
    """The series as at most `width` of the 8 block characters; a flat series is one level, a gap (None) a space.

    Differences smaller than `min_span` (e.g. 256 MiB) are drawn flat, so jitter does not fill the line.
    """
    points = _resample(values, max(0, width))
    known = [v for v in points if v is not None]
    if not known:
        return " " * len(points)
    lo, hi = min(known), max(known)
    span = hi - lo if hi - lo >= min_span else 0.0
    chars = []
    for v in points:
        if v is None:
            chars.append(" ")
        elif span <= 0:
            chars.append(BLOCKS[3])  # flat, or differences below min_span
        else:
            chars.append(BLOCKS[min(7, max(0, int((v - lo) / span * 8 - 1e-9)))])
    return "".join(chars)


def shape(values: Iterable[float | None], swing_mib: float) -> str:
    """"volatile" when max - min exceeds swing_mib (the gpu-memory-volatile rule's figure), else "flat"."""
    known = [v for v in values if v is not None]
    return VOLATILE if known and max(known) - min(known) > swing_mib else FLAT


def memory_series(samples: Iterable[Sample], gpu: int) -> list[int | None]:
    """One GPU's memory (MiB) from telemetry samples, oldest first (None where it was not measured)."""
    return [s.memory(gpu) for s in samples]
