"""The report as one self-contained HTML page: inline CSS and SVG, system fonts, no script, no link out.

Every value shown passes through html.escape (here or in plot.py); secrets were masked before
(story.masked).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from html import escape

from gpuops import __version__
from gpuops.cli.reports.html.plot import Chart, svg
from gpuops.cli.reports.html.stack_view import section as stacks_section
from gpuops.cli.reports.html.story import Story

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px;color:#1b1b1b;
  background:#f6f6f6;max-width:1060px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}h3{font-size:15px;margin:16px 0 6px}
.sub{color:#555;margin:0 0 16px}
section.run{background:#fff;border:1px solid #ddd;border-radius:6px;padding:16px 20px;margin:0 0 24px}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;color:#fff;background:#555}
.ok{background:#1a7f37}.bad{background:#b00020}.warn{background:#9a6700}
table{border-collapse:collapse;font-size:14px}td,th{padding:3px 10px 3px 0;vertical-align:top;text-align:left}
table.summary th{color:#555;font-weight:500;white-space:nowrap}
table.events td:first-child{font-variant-numeric:tabular-nums;white-space:nowrap;color:#555}
pre{background:#f3f3f3;border:1px solid #ddd;padding:8px 10px;overflow-x:auto;font-size:12.5px;
  font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-all}
svg.plot{display:block;margin:8px 0 4px;max-width:100%;height:auto;border:1px solid #e3e3e3}
svg .title{font:600 14px system-ui,"DejaVu Sans",sans-serif;fill:#1b1b1b}
svg .tick{font:11px system-ui,"DejaVu Sans",sans-serif;fill:#444}
svg .axislabel{font:12px system-ui,"DejaVu Sans",sans-serif;fill:#333}
svg .legend{font:12px system-ui,"DejaVu Sans",sans-serif;fill:#1b1b1b}
svg .level{font:11px system-ui,"DejaVu Sans",sans-serif}
svg .marklabel{font:11px system-ui,"DejaVu Sans",sans-serif;paint-order:stroke;stroke:#fff;stroke-width:3px}
svg .empty{font:13px system-ui,"DejaVu Sans",sans-serif;fill:#777}
svg .grid{stroke:#ececec;stroke-width:1}svg .axis{stroke:#888}svg .frame{stroke:#bbb}
.note{color:#555;font-size:13px}
p.plotnote{color:#8a4b00;font-size:13px;margin:0 0 10px}
details{margin:4px 0}details>summary{cursor:pointer;font-size:13.5px;overflow-wrap:anywhere}
details.attempt>summary{font-weight:600;font-size:14.5px;margin:10px 0 4px}
details.stack{margin-left:14px}details.stack>summary{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;
  font-size:12.5px}
details.file{margin-left:14px}details.file>summary{color:#555;font-size:12.5px}
table.threads{font-size:12.5px;margin:4px 0 6px 14px}table.threads td{overflow-wrap:anywhere}
"""


@dataclass
class Section:
    """One target's part of the report: its run's story, or why there is none."""

    target: str
    story: Story | None = None
    missing: str = ""  # why the run's records could not be read
    said: tuple[str, str] = ("", "")  # the command's own outcome and message, when the records are missing
    undrawn: str = ""  # the records were read but could not be drawn: why


def _badge(outcome: str, code: str) -> str:
    cls = "ok" if code == "0" else "warn" if outcome in ("running", "started") else "bad"
    return f'<span class="badge {cls}">{escape(outcome)} · exit {escape(code)}</span>'


def _chart(chart: Chart) -> str:
    """A plot and what it could not draw; a plot that fails is said in its place, the page is still written."""
    try:
        drawn = svg(chart)
    except Exception as exc:  # noqa: BLE001 - one plot never costs the report
        why = escape(f"{chart.title}: this plot could not be drawn ({type(exc).__name__}: {exc}).")
        return f'<p class="plotnote">{why}</p>'
    return drawn + "".join(f'<p class="plotnote">{escape(note)}</p>' for note in chart.notes)


def _story(s: Story) -> str:
    rows = dict(s.rows)
    parts = [f'<h2>{escape(s.target)}: run {escape(s.run)} {_badge(rows.get("outcome", "-"), rows.get("exit code", "-"))}</h2>',
             '<table class="summary">']
    parts += [f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in s.rows]
    parts.append("</table>")
    if s.excerpt:
        parts.append(f"<h3>Matched excerpt</h3><pre>{escape(s.excerpt)}</pre>")
    parts.append('<h3>Over the run\'s time</h3><p class="note">Grey bands: warmups. Dashed lines: marks '
                 "(warmups, training's start, matches, warnings, stall, abort, restarts) and baselines.</p>")
    parts += [_chart(chart) for chart in s.charts]
    if s.happened:
        parts.append('<h3>What happened</h3><table class="events"><tr><th>at</th><th>event</th><th>detail</th></tr>')
        parts += [f"<tr><td>{escape(a)}</td><td>{escape(b)}</td><td>{escape(c)}</td></tr>" for a, b, c in s.happened]
        parts.append("</table>")
    parts.append(stacks_section(s.stacks))
    return "\n".join(parts)


def page(sections: list[Section], command: str) -> str:
    runs = ", ".join(s.story.run for s in sections if s.story) or "no run"
    body = []
    for sec in sections:
        body.append('<section class="run">')
        if sec.story is not None:
            body.append(_story(sec.story))
        else:
            outcome, message = sec.said
            body.append(f"<h2>{escape(sec.target)}: {escape(outcome or 'no run')}</h2>")
            if message:
                body.append(f"<pre>{escape(message)}</pre>")
            why = (f"The run's records were read but could not be drawn: {sec.undrawn}" if sec.undrawn
                   else f"The run's records could not be read: {sec.missing}")
            body.append(f'<p class="note">{escape(why)}</p>')
        body.append("</section>")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>gpuops report: {escape(runs)}</title><style>{CSS}</style></head><body>"
            f"<h1>gpuops report</h1><p class=\"sub\">{escape(command)} · written {stamp} by gpuops {escape(__version__)}"
            "</p>\n" + "\n".join(body) + "\n</body></html>\n")


def write(path: str, text: str) -> None:
    """The page written whole (an exclusive temporary beside it, renamed): a CI upload never takes half a file."""
    from gpuops.localfiles import write_whole

    write_whole(path, text.encode("utf-8"))
