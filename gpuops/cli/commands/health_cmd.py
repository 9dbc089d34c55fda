"""`gpuops health`: each GPU of a target (or of a playbook's run) with its counters, slowdown reasons, link,
temperatures and the host's recent Xids, and a verdict per GPU: ok, warn, needs reset, needs service.

Plain lines, each prefixed by its target (greppable over many targets), a table per target on a terminal, or one
`health` object per target with --json (cli/renderers/health_view.py says them). Exit 0 when every GPU shown may run, 10 when one needs a reset or service, 3 when a target could not be
read (the worst over several targets)."""

from __future__ import annotations

import sys
import time

from gpuops.errors import worst_exit


def run_health(inventory: str | None, playbook: str | None, names: tuple[str, ...], *, every: bool, window: float | None,
               as_json: bool) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from gpuops.client.health_report import read_target
    from gpuops.client.selection import select_targets
    from gpuops.transport import Pool

    sel = select_targets(inventory, playbook, names, every)
    inv, pb = sel.inventory, sel.playbook
    gpus = None
    if pb is not None:
        gpus = tuple(dict.fromkeys([*pb.preflight.gpus, *(pb.warmup.gpus if pb.warmup else ())]))
        window = pb.preflight.xid_window if window is None else window
    pool = Pool(inv)
    try:
        with ThreadPoolExecutor(max_workers=min(8, len(sel.targets))) as ex:
            results = list(ex.map(lambda t: read_target(pool, inv, t, gpus or None, window or 3600.0), sel.targets))
    finally:
        pool.close()
    if as_json:
        from gpuops.cli.renderers.render import iso, json_line

        for r in results:
            sys.stdout.write(json_line({"ts": iso(time.time()), "event": "health", **r.as_json()}) + "\n")
    else:
        from gpuops.cli.renderers.health_view import lines, rich_view

        if sys.stdout.isatty():
            from gpuops.cli.renderers.style import console

            console().print(rich_view(results))
        else:
            sys.stdout.write("".join(f"{r.target}: {line}\n" for r in results for line in lines(r)))
    sys.stdout.flush()
    return worst_exit(r.exit_code for r in results)
