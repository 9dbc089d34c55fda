"""`gpuops metrics`: the current exposition of every run of the targets that goes on, or ended within its
`watch.metrics.keep_ended`, in the Prometheus text format (for a script exporter or a cron job); --json prints one
`metrics` object per run instead (docs/metrics.md, docs/json.md).

Each target's agent reads its runs' records now and sends one snapshot per run; the text is rendered here by the
one renderer the watchdog uses (agent/wire/metric_table.py), all targets' runs in one exposition. A target that
cannot be read is said on stderr (exit 3 for one unreachable); the others' runs are still printed.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from gpuops.errors import GpuopsError, worst_exit

if TYPE_CHECKING:
    from gpuops.targets import Target
    from gpuops.transport import Pool


def snapshots(pool: Pool, target: Target, playbook: str | None) -> tuple[list[dict[str, Any]], GpuopsError | None]:
    """One target's runs as its agent reads them now, or why it could not (one dead host never hides the others)."""
    from gpuops.client.door import Door

    try:
        return Door(pool.target(target), label=target.name).metrics(playbook), None
    except GpuopsError as exc:
        return [], exc


def run_metrics(inventory: str | None, playbook: str | None, names: tuple[str, ...], *, every: bool,
                as_json: bool) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from gpuops.agent.wire.metric_table import RunSnapshot, render
    from gpuops.client.selection import select_targets
    from gpuops.transport import Pool

    sel = select_targets(inventory, playbook, names, every)
    targets, pb = sel.targets, sel.playbook
    pool = Pool(sel.inventory)
    try:
        with ThreadPoolExecutor(max_workers=min(8, len(targets))) as ex:
            results = list(ex.map(lambda t: snapshots(pool, t, pb.name if pb else None), targets))
    finally:
        pool.close()
    codes, runs = [], []
    for target, (rows, error) in zip(targets, results, strict=True):
        if error is not None:
            codes.append(error.exit_code)
            sys.stderr.write(f"gpuops: error: {error}\n" + (f"hint: {error.hint}\n" if error.hint else ""))
            continue
        runs += [(target.name, row) for row in rows]
    if as_json:
        from gpuops.cli.renderers.render import iso, json_line

        now = iso(time.time())
        for name, row in runs:
            snap = RunSnapshot.from_plain(row).plain()
            sys.stdout.write(json_line({"ts": now, "event": "metrics", **snap, "target": name}) + "\n")
    else:
        sys.stdout.write(render([RunSnapshot.from_plain(row) for _, row in runs]))
    sys.stdout.flush()
    return worst_exit(codes)
