"""`gpuops status`: one row block per target; rich on a terminal, plain when piped, JSON with --json."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from gpuops.cli.renderers.status_view import plain_lines, rich_view
from gpuops.errors import status_exit

if TYPE_CHECKING:
    from gpuops.client.status import TargetStatus
    from gpuops.targets import Inventory, Target
    from gpuops.transport import Pool


def run_status(inventory: str | None, playbook: str | None, names: tuple[str, ...], *, refresh_every: float | None,
               as_json: bool, verbose: bool = False, every: bool = False) -> int:
    from gpuops.client.selection import select_targets
    from gpuops.transport import Pool

    sel = select_targets(inventory, playbook, names, every)
    inv, pb, targets = sel.inventory, sel.playbook, sel.targets
    sessions = (pb.launch.session,) if pb else None
    pool = Pool(inv)
    # The connections are made in threads while this one imports and builds the probes: hand the GIL over
    # every 0.5 ms, not 5, so a thread is woken within 0.5 ms of its server's reply (-6 ms per status here).
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        pool.connect_soon(targets)  # the handshakes overlap the rest of this command's start-up
        from gpuops.client.status import each_status
        if refresh_every and not as_json and sys.stdout.isatty():  # piped: plain lines on every refresh
            return _refresh(pool, inv, targets, sessions, refresh_every)
        while True:
            results = []
            for result in each_status(pool, inv, targets, sessions):  # each as soon as it is read
                _print([result], as_json)
                results.append(result)
            if not refresh_every:
                return _code(results)
            time.sleep(refresh_every)
    finally:
        from gpuops.cli.options import report_cost

        report_cost(verbose, pool.transports())
        pool.close()
        sys.setswitchinterval(switch)


def _code(results: list[TargetStatus]) -> int:
    """The contract's status rule (errors.status_exit): 3 if any target could not be read."""
    return status_exit(r.error_code for r in results if r.error_code is not None)


def _print(results: list[TargetStatus], as_json: bool) -> None:
    if as_json:
        from gpuops.cli.renderers.render import iso, json_line

        for r in results:
            sys.stdout.write(json_line({"ts": iso(time.time()), "event": "status", **r.as_json()}) + "\n")
        sys.stdout.flush()
        return
    if sys.stdout.isatty():
        from gpuops.cli.renderers.style import console

        console().print(rich_view(results))
        return
    sys.stdout.write("".join(line + "\n" for r in results for line in plain_lines(r)))
    sys.stdout.flush()


def _refresh(pool: Pool, inv: Inventory, targets: list[Target], sessions: tuple[str, ...] | None, every: float) -> int:
    from rich.live import Live

    from gpuops.client.status import gather

    results = gather(pool, inv, targets, sessions)
    from gpuops.cli.renderers.style import console

    with Live(rich_view(results), refresh_per_second=4, screen=False, console=console()) as live:
        while True:
            time.sleep(every)
            results = gather(pool, inv, targets, sessions)
            live.update(rich_view(results))
