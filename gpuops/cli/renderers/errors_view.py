"""How an error looks to a person: one message, a hint, and what was measured when there is a table."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click

    from gpuops.client.launch.gpus import GpuCheck


def show_error(message: str, hint: str | None, exc: BaseException | None) -> None:
    sys.stderr.write(error_text(message, hint, exc))
    sys.stderr.flush()


def show_click_error(exc: click.ClickException) -> None:
    """click's own errors (a bad option, a missing value) in gpuops' one style, with a usage hint."""
    import click

    ctx = getattr(exc, "ctx", None)
    hint = None
    if isinstance(exc, click.UsageError) and ctx is not None:
        usage = ctx.get_usage().replace("Usage: ", "usage: ", 1)
        hint = f"{usage}; see '{ctx.command_path} --help'"
    show_error(exc.format_message(), hint, None)


def error_text(message: str, hint: str | None, exc: Any, head: str = "gpuops: error: ") -> str:
    """The error's lines: the message after `head`, the measured table or output tail, the hint (`exc`: any error;
    a preflight's findings and thresholds, a warmup's GPU and tail are read where it carries them)."""
    parts = [f"{head}{message}\n"]
    findings = getattr(exc, "findings", None)
    if findings:
        parts.append(_findings_table(findings, exc.thresholds))
    tail = getattr(exc, "tail", None)
    if tail:
        parts.append(f"last {len(tail)} lines of the warmup on GPU {exc.gpu}:\n")
        parts.extend(f"    | {line}\n" for line in tail)
    if hint:
        parts.append(f"hint: {hint}\n")
    return "".join(parts)


def _findings_table(findings: list[GpuCheck], thresholds: dict[str, Any]) -> str:
    rows = [("GPU", "memory used", "limit", "util", "limit", "procs", "verdict")]
    for f in findings:
        rows.append((
            str(f.index),
            "?" if f.memory_used_mib is None else f"{f.memory_used_mib} MiB",
            f"{thresholds['max_memory_used_mib']} MiB",
            "?" if f.utilization_pct is None else f"{f.utilization_pct}%",
            f"{thresholds['max_utilization_pct']}%",
            f"{f.processes}" + ("" if not thresholds["allow_processes"] else " (allowed)"),
            "ok" if f.ok else "BUSY: " + "; ".join(f.problems),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows)
