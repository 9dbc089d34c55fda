"""A run's record (the agent's `report` reply) as what its report shows: the summary's rows, three charts
over the run's time with their marks, and the list of what happened."""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuops.agent.wire.detector_list import DETECTORS
from gpuops.cli.report.plot import PALETTE, THROUGHPUT, Chart, Level, Mark, Series, clock
from gpuops.cli.status_view import job_stop_words, node_words


@dataclass
class Story:
    run: str
    target: str
    rows: list[tuple[str, str]]  # the summary, in order
    excerpt: str
    charts: list[Chart]
    happened: list[tuple[str, str, str]]  # (time since the launch, what, detail)
    stacks: list[dict[str, Any]] = field(default_factory=list)
    stack_summary: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _seconds(value: Any) -> str:
    v = _num(value)
    return "-" if v is None else (f"{v:.1f} s" if v < 120 else f"{clock(v)} ({v:.0f} s)")


def _span(rec: dict[str, Any]) -> tuple[float, float]:
    """The run's time on the target's clock: its first warmup (or sample) to its end (or now, when it lives)."""
    starts = [w["end"] - (_num(w.get("seconds")) or 0) for w in rec.get("warmups") or [] if _num(w.get("end"))]
    starts += [s[0] for s in (rec.get("samples") or [])[:1]]
    starts += [t for t in (_num(rec.get("training_started")),) if t is not None]
    starts += [t for a in rec.get("attempts") or [] for t in (_num(a.get("training_started")),) if t is not None]
    t0 = min(starts) if starts else (_epoch((rec.get("meta") or {}).get("started_at")) or _num(rec.get("now")) or 0.0)
    ends = [s[0] for s in (rec.get("samples") or [])[-1:]] + [_num(e.get("ts")) or t0 for e in rec.get("events") or []]
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
    for w in rec.get("warmups") or []:
        end, secs = _num(w.get("end")), _num(w.get("seconds")) or 0.0
        if end is not None:
            spans.append((end - secs, end, f"warmup GPU {w['gpu']}: {secs:.1f} s"))
            out.append(Mark(end - secs, f"warmup GPU {w['gpu']}", "warmup"))
    firsts = [a.get("training_started") for a in rec.get("attempts") or []] or [rec.get("training_started")]
    if _num(firsts[0]) is not None:
        out.append(Mark(float(firsts[0]), "training starts", "start"))
    for ev in rec.get("events") or []:
        t, kind = _num(ev.get("ts")), ev.get("event")
        if t is None:
            continue
        if kind == "match":
            warn = ev.get("action") != "abort"
            gpu = (ev.get("figures") or {}).get("gpu") if isinstance(ev.get("figures"), dict) else None
            name = str(ev.get("rule")) + (f" (GPU {gpu})" if gpu is not None else "")
            out.append(Mark(t, f"warn: {name}" if warn else name, "warn" if warn else "match"))
        elif kind == "stall":
            out.append(Mark(t, f"stall: {ev.get('seconds')} s silent", "stall"))
        elif kind == "abort_start":
            out.append(Mark(t, f"abort ({ev.get('by') or 'watchdog'})", "abort"))
        elif kind == "restart":
            out.append(Mark(t, f"restart: attempt {ev.get('attempt')} of {ev.get('max_attempts')}", "restart"))
        elif kind == "attempt_started":
            out.append(Mark(t, f"attempt {ev.get('attempt')} starts", "start"))
    code_at = _num(rec.get("exit_code_at"))
    if code_at is not None and not rec.get("abort"):
        code = (rec.get("profile") or {}).get("command_exit_code")
        out.append(Mark(code_at, f"exited ({code})", "end"))
    return out, spans


def charts(rec: dict[str, Any]) -> list[Chart]:
    t0, t1 = _span(rec)
    rows = rec.get("samples") or []
    gpus = sorted({int(g) for r in rows for g in r[1]})
    colour = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(gpus)}
    all_marks, spans = mark_list(rec)
    base = (rec.get("telemetry") or {}).get("baseline") or {}
    tp = [(r[0], r[2]) for r in rows if r[2] is not None]
    levels = []
    if _num(base.get("throughput")) is not None:
        src = base.get("run") or base.get("source") or "baseline"
        levels.append(Level(float(base["throughput"]), f"baseline {figure(float(base['throughput']))} ({src})", "#555555"))
    mem_levels = [Level(float(v), f"GPU {g} baseline {float(v):.0f} MiB", colour.get(int(g), "#555555"))
                  for g, v in sorted((base.get("gpu_memory") or {}).items()) if _num(v) is not None]

    def per_gpu(i: int) -> list[Series]:
        return [Series(f"GPU {g}", [(r[0], (r[1].get(str(g)) or [None, None])[i]) for r in rows], colour[g]) for g in gpus]

    common = {"t0": t0, "t1": t1, "marks": all_marks, "spans": spans}
    # The telemetry series a detector's plot may name (wire/detector_list.Plot), with their baseline levels.
    drawn = {"throughput": ([Series("throughput", tp, THROUGHPUT)] if tp else [], levels, figure),
             "memory": (per_gpu(0), mem_levels, lambda v: f"{v:,.0f}")}
    plots = [d.plot for d in DETECTORS if d.plot is not None and d.plot.series in drawn]
    return [Chart(plot.title, plot.unit, drawn[plot.series][0], levels=drawn[plot.series][1], fmt=drawn[plot.series][2],
                  empty=plot.empty or Chart.empty, **common) for plot in plots] + [
        Chart("GPU utilisation", "%", per_gpu(1), y_max=100.0, fmt=lambda v: f"{v:.0f}", **common),
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
    warm = ", ".join(f"GPU {w['gpu']} {_num(w.get('seconds')) or 0:.1f} s" for w in rec.get("warmups") or []) or "-"
    rows = [
        ("outcome", str(outcome)), ("exit code", "-" if code is None else str(code)),
        ("rule", str(rule or "-")),
        ("stopped by", job_stop_words(rec.get("abort")) or str(prof.get("by") or (rec.get("abort") or {}).get("by") or "-")),
        ("attempts", f"{n} of {most}"),
        ("duration", _seconds(prof.get("duration_s") if prof.get("duration_s") is not None else t1 - t0)),
        ("warmup", warm),
        ("training", _seconds(t1 - started) if started is not None else "never started"),
        ("target", target + (f" (CT {meta['ctid']})" if meta.get("ctid") else "")
         + (f", {node_words(meta.get('job'))} of one torchrun job" if node_words(meta.get("job")) else "")),
        ("command", str(meta.get("command") or "-")),
        ("run id", str(rec.get("run") or "-")), ("playbook", str(meta.get("playbook") or prof.get("playbook") or "-")),
        ("session", str(meta.get("session") or "-")),
        ("started", str(meta.get("started_at") or prof.get("started") or "-")), ("ended", str(prof.get("ended") or "-")),
        ("command exit status", "-" if prof.get("command_exit_code") is None else str(prof["command_exit_code"])),
        ("findings", ", ".join(prof.get("findings") or []) or "none"),
    ]
    if rec.get("session_alive"):
        rows.insert(1, ("state", "still running when this report was written"))
    return rows


def _detail(ev: dict[str, Any]) -> str:
    kind = ev.get("event")
    if kind == "match":
        return f"{ev.get('action')}: rule {ev.get('rule')}: {ev.get('line') or ev.get('description') or ''}"
    if kind == "note":
        return str(ev.get("message") or "")
    if kind == "restart":
        return (f"attempt {ev.get('attempt')} of {ev.get('max_attempts')} after {ev.get('after')}"
                + (", with the compile guard" if ev.get("compile_guard") else ""))
    if kind == "aborted":
        return f"stopped in {ev.get('seconds')} s; survivors: {ev.get('survivors') or 'none'}"
    if kind == "events_left_out":
        return f"{ev.get('count')} more events are in events.jsonl"
    shown = {k: v for k, v in ev.items() if k not in ("event", "ts", "schema_version", "by", "gpus", "advice")}
    return ", ".join(f"{k}={v}" for k, v in shown.items())


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
    happened = [(clock(max(0.0, (_num(e.get("ts")) or t0) - t0), tenths=True), str(e.get("event")), _detail(e))
                for e in rec.get("events") or []]
    summary = said.get("stacks") or abort.get("stacks") or []
    return Story(str(rec.get("run") or "?"), target, summary_rows(rec, target, said), excerpt, charts(rec), happened,
                 rec.get("stacks") or [], summary if isinstance(summary, list) else [])
