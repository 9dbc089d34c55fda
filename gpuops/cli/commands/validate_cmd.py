"""`gpuops validate`: load the files, check the playbook's target (or a job's nodes) exists, say what was checked.

What was checked (`ok:` lines, each target's connection) is the command's output: stdout. Warnings
and notes are diagnostics: stderr, as errors are.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from gpuops.cli.renderers import style as looks
from gpuops.errors import ExitCode, UsageError


def run_validate(inventory: str | None, playbook: str | None, target: str | None, *, as_json: bool) -> int:
    from gpuops.config import load_inventory, load_playbook, resolve_target

    if not inventory and not playbook:
        raise UsageError("nothing to validate: pass --inventory and/or --playbook")
    checked: list[str] = []
    inv = pb = None
    views: list[dict[str, Any]] = []
    if inventory:
        from gpuops.transport.describe import connection
        from gpuops.transport.ssh.resolve import resolve_hosts_soon

        inv = load_inventory(inventory)
        checked.append(f"{inventory}: {len(inv.hosts)} host(s), {len(inv.targets)} target(s)")
        resolve_hosts_soon(inv.hosts, (t.host for t in inv.targets.values()))  # `ssh -G` while the playbook is read
    unset: list[str] = []
    warnings: tuple[str, ...] = ()
    if playbook:
        # The file is what is checked: a from_env variable missing here (a CI lint without the
        # secrets) is a note, not an error; launch refuses to start without it.
        pb = load_playbook(playbook, need_env=False)
        checked.append(f"{playbook}: playbook '{pb.name}', session '{pb.launch.session}'")
        unset = [v.from_env for v in pb.env if v.from_env and v.from_env not in os.environ]
        warnings = pb.warnings
    if inv is not None:
        views = [connection(inv, t) for t in inv.targets.values()]  # as ssh resolves it: nothing connects
        views += [{"name": name, "error": str(exc)} for name, exc in inv.broken.items()]
    if inv is not None and pb is not None and pb.launch.nodes and not target:
        from gpuops.client.selection import node_targets

        # As launch checks them: each node a target of the inventory (at its line), its GPUs the playbook's.
        nodes = [resolve_target(inv, pb, t.name) for t in node_targets(inv, pb)]
        checked.append(f"nodes {', '.join(t.name for t in nodes)} found in {inventory}")
    elif inv is not None and pb is not None and (target or pb.target):
        tgt = resolve_target(inv, pb, target)
        checked.append(f"target '{tgt.name}' found in {inventory}")
    if as_json:
        from gpuops.cli.renderers.render import JsonRenderer
        from gpuops.client.events import Outcome

        data = {"checked": checked, "unset_env": unset, "targets": views,
                "warnings": [*warnings, *(f"target {v['name']} cannot be used: {v['error']}" for v in views if "error" in v)]}
        JsonRenderer().outcome(Outcome("valid", ExitCode.OK, "", data), target or (pb.target if pb else None) or "")
    elif not looks.QUIET:  # -q: the exit code says it; errors still come (exit 2)
        from gpuops.transport.describe import spelled

        for line in checked:
            sys.stdout.write(f"ok: {line}\n")
        for view in views:
            if "error" in view:
                sys.stderr.write(f"warning: target {view['name']} cannot be used: {view['error']}\n")
                continue
            where = f", container {view['ctid']}" if view["ctid"] is not None else ""
            where += f", as {view['become_user']} ({view['become_method']})" if view.get("become_method") else ""
            policy = f" (host keys: {view['host_key_policy']})" if view["host_key_policy"] else ""
            sys.stdout.write(f"  {view['name']}: {spelled(view)}{where}{policy}\n")
        for var in unset:
            sys.stderr.write(f"note: {var} is not set here; the playbook's env reads it (from_env), so launch will need it\n")
        for warning in warnings:
            sys.stderr.write(f"warning: {warning}\n")
    return ExitCode.OK
