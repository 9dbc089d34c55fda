"""`gpuops status`: one row block per target; rich on a terminal, plain when piped, JSON with --json."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from gpuops.errors import status_exit


def run_status(inventory: str | None, playbook: str | None, names: tuple[str, ...], *, watch_every: float | None,
               as_json: bool, verbose: bool = False, every: bool = False) -> int:
    from gpuops.client.status import gather
    from gpuops.transport import Pool

    from gpuops.cli.targets import select_targets

    sel = select_targets(inventory, playbook, names, every)
    inv, pb, targets = sel.inventory, sel.playbook, sel.targets
    sessions = (pb.launch.session,) if pb else None
    pool = Pool(inv)
    try:
        if watch_every and not as_json and sys.stdout.isatty():  # piped: plain lines on every refresh
            return _watch(pool, inv, targets, sessions, watch_every)
        while True:
            results = gather(pool, inv, targets, sessions)
            _print(results, as_json)
            if not watch_every:
                return _code(results)
            time.sleep(watch_every)
    finally:
        from gpuops.cli.common import report_cost

        report_cost(verbose, pool.transports())
        pool.close()


def _code(results: list[Any]) -> int:
    """The contract's status rule (errors.status_exit): 3 if any target could not be read."""
    return status_exit(r.error_code for r in results if r.error_code is not None)


def _print(results: list[Any], as_json: bool) -> None:
    if as_json:
        from gpuops.cli.render import iso

        for r in results:
            sys.stdout.write(json.dumps({"ts": iso(time.time()), "event": "status", **r.as_json()}, default=str) + "\n")
        sys.stdout.flush()
        return
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(_rich(results))
        return
    sys.stdout.write("".join(line + "\n" for r in results for line in plain_lines(r)))
    sys.stdout.flush()


def _watch(pool: Any, inv: Any, targets: list[Any], sessions: Any, every: float) -> int:
    from rich.live import Live

    from gpuops.client.status import gather

    results = gather(pool, inv, targets, sessions)
    with Live(_rich(results), refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(every)
            results = gather(pool, inv, targets, sessions)
            live.update(_rich(results))


def throughput_words(run: Any) -> str:
    """The run's latest throughput figure against its baseline (from the watchdog's heartbeat)."""
    tele = (run.watchdog or {}).get("telemetry") or {}
    figure, base = tele.get("throughput"), (tele.get("baseline") or {}).get("throughput")
    if figure is None:
        return ""
    if not base:
        return f"; throughput {figure:,.0f} (no baseline yet)"
    where = f" of run {tele['baseline']['run']}" if (tele.get("baseline") or {}).get("run") else ""
    return f"; throughput {figure:,.0f} = {figure / base:.2f}x the baseline {base:,.0f}{where}"


_STOPPED_BY = {"watchdog": "the watchdog", "client": "a following client", "stop": "gpuops stop", "timeout": "--timeout"}


def watchdog_words(run: Any) -> str:
    """The run's watchdog in a few words: alive and how fresh, done, or gone while the run goes on."""
    live = run.state in ("running", "aborting")
    age = run.watchdog_age
    if run.watchdog is None:
        return "; no watchdog (only a following client guards it)" if live else ""
    if run.watchdog.get("state") == "done":
        return "; watchdog done"
    restarts = run.watchdog.get("restarts") or 0
    again = f", restarted {restarts}x" if restarts else ""
    if run.watchdog_alive:
        return f"; watchdog alive (heartbeat {age:.1f}s ago{again})"
    if live:
        return (f"; WATCHDOG GONE (last heartbeat {age:.0f}s ago): nothing guards the run; "
                "`gpuops logs -f` watches it" if age is not None else "; WATCHDOG GONE")
    return ""


def plain_lines(r: Any) -> list[str]:
    """Every line prefixed by its target, so output from many targets stays greppable."""
    p = f"{r.target}:"
    if r.error:
        return [f"{p} unreachable: {r.error}"] + ([f"{p} hint: {r.hint}"] if r.hint else [])
    lines = [f"{p} reachable via {r.host}" + (f", container {r.ctid} {r.container}" if r.ctid is not None else "")]
    probe = r.probe
    if probe is None:
        return lines
    if probe.smi == "absent":
        lines.append(f"{p} no nvidia-smi on this target (no GPUs to show)")
    elif probe.smi == "error":
        lines.append(f"{p} nvidia-smi failed: {probe.smi_error}")
    from gpuops.client.status import memory_history

    history = memory_history(probe)
    for g in probe.gpus:
        procs = ", ".join(f"{x.pid}:{x.name}:{x.used_mib}MiB" for x in g.processes) or "-"
        util = "?" if g.utilization_pct is None else f"{g.utilization_pct}%"
        line = f"{p} gpu {g.index} {g.memory_used_mib}/{g.memory_total_mib} MiB util {util} procs {procs}"
        if g.index in history:
            from gpuops.cli.spark import shape, sparkline

            series, swing = history[g.index]
            line += f" memory {sparkline(series, 30, min_span=256)} {shape(series, swing)}"
        lines.append(line)
    if not probe.tmux:
        lines.append(f"{p} tmux is not installed")
    for s in probe.sessions.values():
        text = f"{p} session {s.session} {'alive' if s.alive else 'not running'}"
        if s.locked_by:
            text += f"; launch in progress ({s.locked_by})"
        if s.run:
            ago = s.run.seconds_since_log
            text += f"; run {s.run.run_id} {s.run.state}"
            if s.run.exit_code is not None:
                text += f" (exit {s.run.exit_code})"
            if ago is not None:
                text += f"; log grew {ago:.0f}s ago"
            rule = (s.run.abort or {}).get("rule")
            if rule:
                text += f"; matched {rule}"
            by = (s.run.abort or {}).get("by")
            if by:
                text += f"; stopped by {_STOPPED_BY.get(by, by)}"
            text += throughput_words(s.run) if s.alive else ""
            text += watchdog_words(s.run)
        lines.append(text)
    if not probe.sessions:
        lines.append(f"{p} no gpuops runs")
    return lines


def _rich(results: list[Any]) -> Any:
    """The status as rich renderables; every text is a rich Text, so `[host]:port` or `:name:` is never markup."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for r in results:
        head = Table.grid(padding=(0, 1))
        head.add_row(Text(r.target, style="bold"), *(Text(t) for t in plain_lines(r)[0].split(":", 1)[1:]))
        parts.append(head)
        if r.probe is None:
            parts.extend(Text("  " + line.split(":", 1)[1].strip()) for line in plain_lines(r)[1:])
            continue
        if r.probe.gpus:
            from gpuops.cli.spark import shape, sparkline
            from gpuops.client.status import memory_history

            history = memory_history(r.probe)
            t = Table(show_edge=False, pad_edge=False)
            for col in ("GPU", "memory used", "total", "util", "processes") + (("memory, last minutes",) if history else ()):
                t.add_column(col)
            for g in r.probe.gpus:
                cells = [str(g.index), f"{g.memory_used_mib} MiB", f"{g.memory_total_mib} MiB",
                         "?" if g.utilization_pct is None else f"{g.utilization_pct}%",
                         ", ".join(f"{x.pid} {x.name} {x.used_mib} MiB" for x in g.processes) or "-"]
                if history:
                    series, swing = history.get(g.index, ([], 0.0))
                    cells.append(f"{sparkline(series, 30, min_span=256)} {shape(series, swing)}" if series else "")
                t.add_row(*(Text(c) for c in cells))
            parts.append(t)
        for line in plain_lines(r)[1:]:
            if " gpu " not in line:
                parts.append(Text("  " + line.split(":", 1)[1].strip()))
    return Group(*parts)
