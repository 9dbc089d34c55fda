"""`gpuops runs`: the run history of each target, newest first, read from its run directories
(so it works from any machine): a table on a terminal, JSON Lines with --json.

On a terminal the table fits its width: the columns that matter least go first (GPU memory, throughput,
findings, warmup, playbook, duration, started, rule), never the run, its outcome or its exit code; a
short note on stderr says so. Into a pipe or a file every column is written.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from gpuops.errors import GpuopsError, worst_exit

if TYPE_CHECKING:
    from gpuops.targets import Inventory, Target
    from gpuops.transport import Pool


def history(pool: Pool, inventory: Inventory, target: Target, limit: int, playbook: str | None = None
            ) -> tuple[list[dict[str, Any]], GpuopsError | None]:
    """One target's runs (of `playbook`: the target filters, then limits), or why they could not be read
    (one dead host never hides the others)."""
    from gpuops.client.door import Door

    try:
        return Door(pool.target(target), label=target.name).runs(limit, playbook), None
    except GpuopsError as exc:
        return [], exc


def run_runs(inventory: str | None, playbook: str | None, names: tuple[str, ...], *, every: bool, limit: int,
             as_json: bool) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from gpuops.client.selection import select_targets
    from gpuops.transport import Pool

    sel = select_targets(inventory, playbook, names, every)
    inv, pb, targets = sel.inventory, sel.playbook, sel.targets
    pool = Pool(inv)
    try:
        with ThreadPoolExecutor(max_workers=min(8, len(targets))) as ex:
            results = list(ex.map(lambda t: history(pool, inv, t, limit, pb.name if pb else None), targets))
    finally:
        pool.close()
    codes = []
    for target, (rows, error) in zip(targets, results, strict=True):
        if error is not None:
            codes.append(error.exit_code)
            sys.stderr.write(f"gpuops: error: {error}\n" + (f"hint: {error.hint}\n" if error.hint else ""))
            continue
        if as_json:
            _json(target.name, rows)
        else:
            sys.stdout.write(table(target.name, rows, _width()))
    sys.stdout.flush()
    return worst_exit(codes)


def _width() -> int | None:
    """The terminal's width (COLUMNS, else the terminal's size); None when stdout is no terminal."""
    import shutil

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


#: Columns left out first when the table is wider than the terminal; the others (run, outcome, exit) stay.
_DROP_ORDER = ("GPU memory MiB", "throughput", "findings", "warmup s/GPU", "playbook", "duration", "started", "rule")


def _json(target: str, rows: list[dict[str, Any]]) -> None:
    from gpuops.cli.renderers.render import iso, json_line

    for row in rows:
        obj = {"ts": iso(time.time()), "event": "run", "target": target, **row}
        sys.stdout.write(json_line(obj) + "\n")


def _figure(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.0f}k" if value >= 10000 else f"{value:g}"


def _gpu(row: dict[str, Any]) -> str:
    """A run its hardware ended: ` (Xid 79 on GPU 5 00000000:9A:00.0)` or ` (GPU 5 00000000:9A:00.0: its counter)`."""
    hw = row.get("hardware")
    if not isinstance(hw, dict):
        return ""
    gpu = hw.get("gpu") or {}
    where = f"GPU {gpu.get('index')}" + (f" {gpu['bus_id']}" if gpu.get("bus_id") else "")
    xid = hw.get("xid") or {}
    return f" (Xid {xid.get('code')} on {where})" if xid else f" ({where}: {hw.get('counter')})"


def table(target: str, rows: list[dict[str, Any]], width: int | None = None) -> str:
    """Plain columns, one run a line, every line prefixed by its target (greppable on many targets); at most
    `width` characters a line where it is given (columns dropped, least useful first)."""
    head = ("run", "playbook", "started", "duration", "warmup s/GPU", "outcome", "exit", "rule", "findings", "throughput",
            "GPU memory MiB")
    lines = [head]
    for r in rows:
        warm = r.get("warmup_seconds") or {}
        gpus = r.get("gpus") or {}
        job = r.get("job") or {}
        node = f" (node {job['node_rank']}/{len(job.get('nodes') or [])})" if isinstance(job.get("node_rank"), int) else ""
        by_node = f" (on {job['ended_by_node']})" if job.get("ended_by_node") else ""
        lines.append((
            str(r.get("run")) + node, str(r.get("playbook") or "-"), str(r.get("started") or "-"),
            "-" if r.get("duration_s") is None else f"{r['duration_s']:.0f}s",
            " ".join(f"{g}:{s:.0f}" for g, s in sorted(warm.items())) or "-",
            str(r.get("outcome")) + (f" (attempt {r['attempts']})" if (r.get("attempts") or 1) > 1 else ""),
            "-" if r.get("exit_code") is None else str(r["exit_code"]), str(r.get("rule") or "-") + by_node + _gpu(r),
            ",".join(map(str, r.get("findings") or ())) or "-",
            _figure((r.get("throughput") or {}).get("median")),
            " ".join(f"{g}:{v.get('median'):.0f}" for g, v in sorted(gpus.items()) if v.get("median") is not None) or "-",
        ))
    if len(lines) == 1:
        return f"{target}: no runs\n"
    keep = list(range(len(head)))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    dropped = []
    for name in _DROP_ORDER:
        if width is None or len(target) + 2 + sum(widths[i] + 2 for i in keep) - 2 <= width:
            break
        keep.remove(head.index(name))
        dropped.append(name)
    if dropped:
        sys.stderr.write(f"({len(dropped)} columns hidden to fit; --json or a pipe shows all)\n")
    hung = [f"{target}: {r.get('run')}: the job hung: {(r.get('job') or {})['hang'].get('text')}\n" for r in rows
            if isinstance((r.get("job") or {}).get("hang"), dict)]  # a stalled torchrun job: where, in words
    return "".join(f"{target}: " + "  ".join(row[i].ljust(widths[i]) for i in keep).rstrip() + "\n"
                   for row in lines) + "".join(hung)
