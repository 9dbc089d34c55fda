"""A run's record (the agent's `report` reply) as what its report shows: the summary's rows, three charts
over the run's time with their marks, the list of what happened (happened.py) and every attempt's stacks
(stack_view.py). A figure or time that is not finite or past plot.LIMIT is left out of its plot, and the
plot's notes say which and when: no record can break the page."""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuops.agent.wire.detector_list import DETECTORS
from gpuops.agent.wire.verdict import record_words
from gpuops.cli.renderers.status_view import job_stop_words, node_words
from gpuops.cli.reports.html.happened import detail, name, number, words
from gpuops.cli.reports.html.plot import LIMIT, PALETTE, THROUGHPUT, Chart, Level, Mark, Series, clock, drawable
from gpuops.cli.reports.html.stack_view import Attempt, attempts


@dataclass
class Story:
    run: str
    target: str
    rows: list[tuple[str, str]]  # the summary, in order
    excerpt: str
    charts: list[Chart]
    happened: list[tuple[str, str, str]]  # (time since the launch, what, detail)
    stacks: list[Attempt] = field(default_factory=list)  # each attempt's, oldest first


def masked(value: Any, mask: Callable[[str], str]) -> Any:
    """Every string of a decoded JSON value through `mask` (secrets as ***)."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, list):
        return [masked(v, mask) for v in value]
    if isinstance(value, dict):
        return {k: masked(v, mask) for k, v in value.items()}
    return value


def figure(value: float) -> str:
    """A throughput figure as people say it: 505695 -> 506k."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g}{suffix}"
    return f"{value:g}"


def _epoch(stamp: Any) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def _num(value: Any) -> float | None:
    """A figure or a time the report can compute with: None when it is no number, not finite or past LIMIT."""
    return float(value) if drawable(value) else None


Row = tuple[float, dict[int, list[Any]], Any, Any]  # t, {gpu: [MiB, %]}, throughput, attempt


def rows_of(rec: dict[str, Any]) -> list[Row]:
    """The agent's sample rows [t, {gpu: [MiB, %]}, throughput, attempt] that have a time to place them at
    (their figures are checked where they are drawn: a row is not lost for one figure)."""
    out: list[Row] = []
    for r in rec.get("samples") or []:
        if not isinstance(r, list) or len(r) < 2 or _num(r[0]) is None or not isinstance(r[1], dict):
            continue
        gpus = {int(g): list(v) + [None, None] for g, v in r[1].items()
                if str(g).isdigit() and len(str(g)) < 6 and isinstance(v, list)}
        out.append((float(r[0]), gpus, r[2] if len(r) > 2 else None, r[3] if len(r) > 3 else None))
    return out


def _shown(value: Any) -> str:
    """A figure left out of a plot, as the note names it."""
    try:
        return number(value) if not isinstance(value, int) else f"{float(value):.3g}"
    except OverflowError:
        return "a number past 1e308"


def left_out_note(left: list[tuple[float, Any]], t0: float, what: str = "figure") -> list[str]:
    """Why the plot lacks some of the record's figures (not finite, or too large to draw), with when."""
    if not left:
        return []
    named = ", ".join(f"{_shown(v)} at {clock(t - t0, tenths=True)}" for t, v in left[:3]) + (
        f" and {len(left) - 3} more" if len(left) > 3 else "")
    n = len(left)
    return [f"Left out of this plot: {n} {what}{'s' if n != 1 else ''} that cannot be drawn "
            f"(not finite, or past {LIMIT:g}): {named}."]


def _seconds(value: Any) -> str:
    v = _num(value)
    return "-" if v is None else (f"{v:.1f} s" if v < 120 else f"{clock(v)} ({v:.0f} s)")


def _span(rec: dict[str, Any]) -> tuple[float, float]:
    """The run's time on the target's clock: its first warmup (or sample) to its end (or now, when it lives)."""
    rows = rows_of(rec)
    starts = [end - (_num(w.get("seconds")) or 0) for w in rec.get("warmups") or [] for end in (_num(w.get("end")),)
              if end is not None]
    starts += [r[0] for r in rows[:1]]
    starts += [t for t in (_num(rec.get("training_started")),) if t is not None]
    starts += [t for a in rec.get("attempts") or [] for t in (_num(a.get("training_started")),) if t is not None]
    t0 = min(starts) if starts else (_epoch((rec.get("meta") or {}).get("started_at")) or _num(rec.get("now")) or 0.0)
    ends = [r[0] for r in rows[-1:]] + [_num(e.get("ts")) or t0 for e in rec.get("events") or [] if isinstance(e, dict)]
    ends += [t for t in (_num(rec.get("exit_code_at")), _num((rec.get("abort_done") or {}).get("session_gone_at")))
             if t is not None]
    if rec.get("session_alive"):
        ends.append(_num(rec.get("now")) or t0)
    return t0, max([t0 + 1.0, *ends])


def mark_list(rec: dict[str, Any]) -> tuple[list[Mark], list[tuple[float, float, str]]]:
    """The marks on every chart (warmups, training's start, matches, warnings, stall, abort, restarts, the
    end) and the warmups' shaded spans."""
    out: list[Mark] = []
    spans = []
    for w in [w for w in rec.get("warmups") or [] if isinstance(w, dict)]:
        end, secs = _num(w.get("end")), _num(w.get("seconds")) or 0.0
        if end is not None:
            spans.append((end - secs, end, f"warmup GPU {words(w.get('gpu'))}: {secs:.1f} s"))
            out.append(Mark(end - secs, f"warmup GPU {words(w.get('gpu'))}", "warmup"))
    firsts = [a.get("training_started") for a in rec.get("attempts") or []] or [rec.get("training_started")]
    if _num(firsts[0]) is not None:
        out.append(Mark(float(firsts[0]), "training starts", "start"))
    for ev in [e for e in rec.get("events") or [] if isinstance(e, dict)]:
        t, kind = _num(ev.get("ts")), ev.get("event")
        if t is None:
            continue
        if kind == "match":
            warn = ev.get("action") != "abort"
            fig = f if isinstance(f := ev.get("figures"), dict) else {}
            gpu, xid = fig.get("gpu"), fig.get("xid")
            rule = words(ev.get("rule") or "unnamed rule") + (f": Xid {words(xid)}" if xid is not None else "") + (
                f" (GPU {words(gpu)})" if gpu is not None else "")
            out.append(Mark(t, f"warn: {rule}" if warn else rule, "warn" if warn else "match"))
        elif kind == "hardware":  # a stall or crash the watchdog put down to an Xid on a run GPU
            fig = f if isinstance(f := ev.get("figures"), dict) else {}
            out.append(Mark(t, f"hardware: Xid {words(fig.get('xid'))} (GPU {words(fig.get('gpu'))})", "abort"))
        elif kind == "stall":
            out.append(Mark(t, f"stall: {words(ev.get('seconds'))} s silent", "stall"))
        elif kind == "abort_start":
            out.append(Mark(t, f"abort ({words(ev.get('by') or 'watchdog')})", "abort"))
        elif kind == "restart":
            out.append(Mark(t, f"restart: attempt {words(ev.get('attempt'))} of {words(ev.get('max_attempts'))}", "restart"))
        elif kind == "attempt_started":
            out.append(Mark(t, f"attempt {words(ev.get('attempt'))} starts", "start"))
    code_at = _num(rec.get("exit_code_at"))
    if code_at is not None and not rec.get("abort"):
        code = (rec.get("profile") or {}).get("command_exit_code")
        out.append(Mark(code_at, f"exited ({words(code)})", "end"))
    return out, spans


def charts(rec: dict[str, Any]) -> list[Chart]:
    t0, t1 = _span(rec)
    rows = rows_of(rec)
    gpus = sorted({g for r in rows for g in r[1]})
    colour = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(gpus)}
    all_marks, spans = mark_list(rec)
    base = (rec.get("telemetry") or {}).get("baseline") or {}
    tp = [(t, v) for t, _, v, _ in rows if v is not None]
    levels, notes = [], []
    if _num(base.get("throughput")) is not None:
        src = base.get("run") or base.get("source") or "baseline"
        levels.append(Level(float(base["throughput"]), f"baseline {figure(float(base['throughput']))} ({src})", "#555555"))
    elif base.get("throughput") is not None:
        notes.append(f"The baseline ({_shown(base.get('throughput'))}) cannot be drawn: left out.")
    mem_base = {g: v for g, v in (base.get("gpu_memory") or {}).items() if str(g).isdigit() and v is not None}
    mem_levels = [Level(float(v), f"GPU {g} baseline {float(v):.0f} MiB", colour.get(int(g), "#555555"))
                  for g, v in sorted(mem_base.items()) if _num(v) is not None]
    mem_left = [f"GPU {g} {_shown(v)}" for g, v in sorted(mem_base.items()) if _num(v) is None]

    def per_gpu(i: int) -> tuple[list[Series], list[str]]:
        series, left = [], []
        for g in gpus:
            points = [(t, r.get(g, [None, None])[i]) for t, r, _, _ in rows]
            left += [(t, v) for t, v in points if v is not None and not drawable(v)]
            series.append(Series(f"GPU {g}", [(t, v if drawable(v) else None) for t, v in points], colour[g]))
        return series, left_out_note(sorted(left, key=lambda p: p[0]), t0, "sample")

    mem, mem_notes = per_gpu(0)
    mem_notes += [f"The baseline ({', '.join(mem_left)}) cannot be drawn: left out."] if mem_left else []
    util, util_notes = per_gpu(1)
    # The telemetry series a detector's plot may name (wire/detector_list.Plot), with their baseline levels and
    # what could not be drawn of them.
    tp_notes = left_out_note([(t, v) for t, v in tp if not drawable(v)], t0) + notes
    drawn = {"throughput": ([Series("throughput", tp, THROUGHPUT)] if tp else [], levels, figure, tp_notes),
             "memory": (mem, mem_levels, lambda v: f"{v:,.0f}", mem_notes)}
    plots = [d.plot for d in DETECTORS if d.plot is not None and d.plot.series in drawn]
    return [Chart(plot.title, plot.unit, drawn[plot.series][0], levels=drawn[plot.series][1], fmt=drawn[plot.series][2],
                  empty=plot.empty or Chart.empty, notes=drawn[plot.series][3], t0=t0, t1=t1, marks=all_marks, spans=spans)
            for plot in plots] + [
        Chart("GPU utilisation", "%", util, y_max=100.0, fmt=lambda v: f"{v:.0f}", notes=util_notes, t0=t0, t1=t1,
              marks=all_marks, spans=spans),
    ]


def summary_rows(rec: dict[str, Any], target: str, said: dict[str, Any]) -> list[tuple[str, str]]:
    meta, prof = rec.get("meta") or {}, rec.get("profile") or {}
    att = rec.get("attempt") or {}
    code = said.get("exit_code", prof.get("exit_code"))
    outcome = said.get("outcome") or prof.get("outcome") or "-"
    rule = said.get("rule") or prof.get("rule")
    n = att.get("attempt") if isinstance(att.get("attempt"), int) else prof.get("attempts") or 1
    most = att.get("max_attempts") or (rec.get("telemetry") or {}).get("max_attempts") or n
    started = _num(rec.get("training_started"))
    t0, t1 = _span(rec)
    warm = ", ".join(f"GPU {words(w.get('gpu'))} {_num(w.get('seconds')) or 0:.1f} s" for w in rec.get("warmups") or []
                     if isinstance(w, dict)) or "-"
    rows = [
        ("outcome", words(outcome)), ("exit code", "-" if code is None else words(code)),
        ("rule", words(rule or "-")),
        ("stopped by", job_stop_words(rec.get("abort")) or words(prof.get("by") or (rec.get("abort") or {}).get("by") or "-")),
        ("attempts", f"{words(n)} of {words(most)}"),
        ("duration", _seconds(prof.get("duration_s") if prof.get("duration_s") is not None else t1 - t0)),
        ("warmup", warm),
        ("training", _seconds(t1 - started) if started is not None else "never started"),
        ("target", target + (f" (CT {meta['ctid']})" if meta.get("ctid") else "")
         + (f", {node_words(meta.get('job'))} of one torchrun job" if node_words(meta.get("job")) else "")),
        ("command", words(meta.get("command") or "-")),
        ("run id", words(rec.get("run") or "-")), ("playbook", words(meta.get("playbook") or prof.get("playbook") or "-")),
        ("session", words(meta.get("session") or "-")),
        ("started", words(meta.get("started_at") or prof.get("started") or "-")), ("ended", words(prof.get("ended") or "-")),
        ("command exit status", "-" if prof.get("command_exit_code") is None else words(prof["command_exit_code"])),
        ("findings", words(prof.get("findings") or "none")),
    ]
    hang = (rec.get("abort_done") or {}).get("hang")
    if isinstance(hang, dict) and hang.get("text"):  # a stalled torchrun job: where it hung, as every node read it
        rows.insert(4, ("where the job hung", words(hang["text"])))
    if isinstance(prof.get("hardware"), dict):  # the GPU that ended it, the Xid or counter, NVIDIA's action
        rows.insert(3, ("GPU fault", record_words(prof["hardware"])))
    if rec.get("session_alive"):
        rows.insert(1, ("state", "still running when this report was written"))
    return rows


def story(rec: dict[str, Any], target: str, said: dict[str, Any], mask: Callable[[str], str]) -> Story:
    """What the report says about one run; `said`: the client's outcome (outcome, exit_code, rule, excerpt), if any."""
    rec = masked(rec, mask)
    said = masked(said, mask)
    t0, _ = _span(rec)
    abort = rec.get("abort") or {}
    excerpt = str(said.get("excerpt") or abort.get("excerpt") or "")
    if not excerpt:
        for a in reversed(rec.get("attempts") or []):
            if a.get("excerpt"):
                excerpt = f"(attempt {a.get('attempt')}) " + str(a["excerpt"])
                break
    happened = [(clock(max(0.0, (_num(e.get("ts")) or t0) - t0), tenths=True), name(e), detail(e))
                for e in rec.get("events") or [] if isinstance(e, dict)]
    summary = said.get("stacks") or abort.get("stacks")
    return Story(str(rec.get("run") or "?"), target, summary_rows(rec, target, said), excerpt, charts(rec), happened,
                 attempts(rec, summary if isinstance(summary, list) else None))
