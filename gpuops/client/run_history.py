"""A target's run history, read from its run directories by the agent's `runs` tool (any machine can)."""

from __future__ import annotations

import json
from typing import Any

from gpuops.errors import GpuopsError


def read_history(transport: Any, *, label: str, timeout: float, limit: int, playbook: str | None = None
                 ) -> list[dict[str, Any]]:
    """The target's runs (of `playbook`, filtered there before the limit), newest first, one record each;
    GpuopsError when they cannot be read."""
    from gpuops.client import tools
    from gpuops.client.remote import run_tool

    result = run_tool(transport, tools.runs(limit, playbook), timeout=timeout, label=label)
    if result.exit_code != 0:
        raise GpuopsError(f"{label}: could not read the run history (exit {result.exit_code}): {result.err.strip()[-300:]}")
    rows = []
    for line in result.out.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("run"):
            rows.append(row)
    return rows
