"""Line charts over a run's time as inline SVG: axes with round ticks, a legend, dashed level lines,
labelled vertical marks and shaded spans. Hand-drawn (docs/dependencies.md says why): every text
goes through html.escape here, so a rule name or a GPU label cannot break the page.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from html import escape
from typing import Any, Callable, Optional, Sequence, TypeGuard

Point = tuple[float, Optional[float]]

#: Colour-blind-safe (Okabe-Ito), one per series in order; marks have their own by kind.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
THROUGHPUT = "#7B2D8E"  # a colour no text and no GPU uses
MARK_COLOURS = {"warmup": "#7a7a7a", "start": "#009E73", "match": "#D55E00", "warn": "#E69F00", "abort": "#B00020",
                "restart": "#0072B2", "stall": "#B00020", "end": "#333333"}


@dataclass
class Series:
    name: str
    points: list[Point]
    colour: str
    dashed: bool = False


@dataclass
class Level:
    """A horizontal line (a baseline) with its label."""

    y: float
    label: str
    colour: str


@dataclass
class Mark:
    t: float
    label: str
    kind: str


@dataclass
class Chart:
    title: str
    unit: str
    series: list[Series]
    t0: float
    t1: float
    levels: list[Level] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    spans: list[tuple[float, float, str]] = field(default_factory=list)
    y_max: float | None = None  # a fixed top (utilisation: 100)
    empty: str = "no samples"
    fmt: Callable[[float], str] = lambda v: f"{v:g}"
    notes: list[str] = field(default_factory=list)  # said under the plot (figures left out, and why)


W, H = 1000, 300
LEFT, RIGHT, TOP, BOTTOM = 78, 20, 44, 44
#: The largest magnitude drawn, for a figure as for a time: past it (1e15 tokens/s, MiB or seconds is no
#: measurement) a value is left out, so the scale's arithmetic never overflows (story.py says so on the page).
LIMIT = 1e15


def drawable(value: Any) -> TypeGuard[float]:
    """A number the plot can place: finite and within LIMIT (inf, nan, 1.7e308, a 400-digit int are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= LIMIT if isinstance(value, int) else math.isfinite(value) and abs(value) <= LIMIT


def nice_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 5 times a power of ten)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / max(1, most - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        if v >= lo - step * 1e-9:
            ticks.append(round(v, 10))
        v += step
    return ticks


def time_ticks(span: float, most: int = 9) -> list[float]:
    """Seconds-since-start ticks at steps a person counts in (1 s ... 1 day)."""
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
    step = next((s for s in steps if span / s <= most - 1), 86400 * math.ceil(span / 86400 / (most - 1)))
    return [i * step for i in range(int(span // step) + 1)]


def clock(seconds: float, tenths: bool = False) -> str:
    """Seconds since the start as a person reads them: 45s (9.7s with tenths), 2:05, 1:02:05."""
    s = int(round(seconds))
    if tenths and seconds < 60:
        return f"{seconds:.1f}s"
    if s < 60:
        return f"{s}s"
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def _segments(points: Sequence[Point], gap: float) -> list[list[tuple[float, float]]]:
    """Runs of measured points; a missing value or a pause longer than `gap` breaks the line."""
    runs: list[list[tuple[float, float]]] = []
    last_t: float | None = None
    for t, v in points:
        if v is None:
            last_t = None
            continue
        if last_t is None or t - last_t > gap or not runs:
            runs.append([])
        runs[-1].append((t, v))
        last_t = t
    return runs


def _gap(points: Sequence[Point]) -> float:
    ts = sorted(t for t, _ in points)
    steps = sorted(b - a for a, b in itertools.pairwise(ts) if b > a)
    return max(5.0, 5 * steps[len(steps) // 2]) if steps else math.inf


def _clusters(marks: Sequence[Mark], x: Callable[[float], float], column: float = 13) -> list[tuple[float, list[Mark]]]:
    """Marks whose labels would collide share one group: its labels stand side by side in columns from the
    first mark's line (a match and its abort are milliseconds apart; a restart follows a second later)."""
    out: list[tuple[float, list[Mark]]] = []
    for m in sorted(marks, key=lambda m: m.t):
        px = x(m.t)
        if out and px - out[-1][0] < column * len({g.label for g in out[-1][1]}) + 4:
            out[-1][1].append(m)
        else:
            out.append((px, [m]))
    return out


def svg(chart: Chart) -> str:
    """The chart as one <svg> element (no script, no external reference). Values that are not drawable
    (see LIMIT) are left out here too, whatever the caller passed: no figure can break the page."""
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    t0 = float(chart.t0) if drawable(chart.t0) else 0.0
    t1 = max(float(chart.t1) if drawable(chart.t1) else t0, t0 + 1)
    series = [Series(s.name, [(float(t), float(v) if drawable(v) else None) for t, v in s.points if drawable(t)],
                     s.colour, s.dashed) for s in chart.series]
    levels = [lv for lv in chart.levels if drawable(lv.y)]
    marks = [m for m in chart.marks if drawable(m.t)]
    spans = [(a, b, label) for a, b, label in chart.spans if drawable(a) and drawable(b)]
    values = [v for s in series for _, v in s.points if v is not None] + [float(lv.y) for lv in levels]
    bottom = min([0.0, *values])
    top = float(chart.y_max) if drawable(chart.y_max) else (max(values) * 1.08 if values else 1.0)
    top = top if top > bottom else bottom + 1.0
    y_ticks = nice_ticks(bottom, top)
    bottom, top = min(bottom, y_ticks[0]), max(top, y_ticks[-1])

    def x(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        return TOP + ph - (v - bottom) / (top - bottom) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           f'role="img" aria-label="{escape(chart.title)}">',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
           f'<text x="{LEFT}" y="18" class="title">{escape(chart.title)}</text>']
    for a, b, label in spans:
        xa, xb = x(a), max(x(b), x(a) + 2)
        out.append(f'<rect x="{xa:.1f}" y="{TOP}" width="{xb - xa:.1f}" height="{ph}" fill="#e8e8e8">'
                   f'<title>{escape(label)}</title></rect>')
    for v in y_ticks:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                   f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" class="tick" text-anchor="end">{escape(chart.fmt(v))}</text>')
    for tick in time_ticks(t1 - t0):
        out.append(f'<line x1="{x(t0 + tick):.1f}" x2="{x(t0 + tick):.1f}" y1="{TOP + ph}" y2="{TOP + ph + 5}" '
                   f'class="axis"/><text x="{x(t0 + tick):.1f}" y="{TOP + ph + 18}" class="tick" '
                   f'text-anchor="middle">{clock(tick)}</text>')
    out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{H - 6}" class="axislabel" text-anchor="middle">time since the launch</text>'
               f'<text x="14" y="{TOP + ph / 2:.0f}" class="axislabel" text-anchor="middle" '
               f'transform="rotate(-90 14 {TOP + ph / 2:.0f})">{escape(chart.unit)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" class="frame"/>')
    for lv in levels:  # named in the legend: a label on the plot would collide with the marks' labels
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y(lv.y):.1f}" y2="{y(lv.y):.1f}" stroke="{lv.colour}" '
                   f'stroke-width="1.5" stroke-dasharray="7 4"><title>{escape(lv.label)}</title></line>')
    drawn = False
    for i, s in enumerate(series):
        width = 2 + 1.5 * (len(series) - 1 - i)  # earlier series wider: GPUs that read alike stay visible
        for run in _segments(s.points, _gap(s.points)):
            drawn = True
            if len(run) == 1:
                out.append(f'<circle cx="{x(run[0][0]):.1f}" cy="{y(run[0][1]):.1f}" r="2.5" fill="{s.colour}"/>')
                continue
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run)
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" stroke-width="{width:g}" '
                       f'stroke-linejoin="round"{dash}/>')
    if not drawn:
        out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{TOP + ph / 2:.0f}" class="empty" '
                   f'text-anchor="middle">{escape(chart.empty)}</text>')
    for px, group in _clusters(marks, x):
        labels = list(dict.fromkeys(m.label for m in group))
        tip = "; ".join(f"{clock(m.t - t0, tenths=True)} {m.label}" for m in group)
        out.append(f'<g class="mark"><title>{escape(tip)}</title>')
        for m in group:
            colour = MARK_COLOURS.get(m.kind, "#333333")
            out.append(f'<line x1="{x(m.t):.1f}" x2="{x(m.t):.1f}" y1="{TOP}" y2="{TOP + ph}" stroke="{colour}" '
                       f'stroke-width="1.5" stroke-dasharray="3 3"/>')
        right = px < LEFT + pw - 16 * len(labels)  # near the right edge the labels go left of the line
        for j, label in enumerate(labels):  # one column each, so every label stays whole
            lx = px + 4 + 13 * j if right else px - 14 - 13 * j
            kind = next(m.kind for m in group if m.label == label)
            out.append(f'<text class="marklabel" fill="{MARK_COLOURS.get(kind, "#333333")}" '
                       f'transform="translate({lx:.1f} {TOP + 6}) rotate(90)">{escape(label)}</text>')
        out.append("</g>")
    out.append(_legend(series, levels))
    out.append("</svg>")
    return "".join(out)


def _legend(series: Sequence[Series], levels: Sequence[Level]) -> str:
    """The series' names with their colours, right-aligned above the plot area."""
    items = [(s.name, s.colour, s.dashed) for s in series] + [(lv.label, lv.colour, True) for lv in levels]
    parts, xpos = [], W - RIGHT
    for name, colour, dashed in reversed(items):
        width = 26 + 7 * len(name)
        xpos -= width
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        parts.append(f'<line x1="{xpos}" x2="{xpos + 18}" y1="30" y2="30" stroke="{colour}" stroke-width="3"{dash}/>'
                     f'<text x="{xpos + 22}" y="34" class="legend">{escape(name)}</text>')
    return '<g class="legendbox">' + "".join(parts) + "</g>"
