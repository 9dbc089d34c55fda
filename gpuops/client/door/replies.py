"""What the agent's `runs` and `report` tools answer (JSON lines, read past a shell's noise) and a GPU's memory
after a warmup. The replies of the marked tools (probe, lock, start, abort ...) and the follower's frames are
typed once, in the wire (agent/wire/marks.py, frames.py), and used as they are."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


# -- runs ----------------------------------------------------------------------------------------------
def read_runs(text: str) -> list[dict[str, Any]]:
    """The `runs` tool's JSON lines: one record per run (lines that are not one are noise of the shell)."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("run"):
            rows.append(row)
    return rows


def read_report(text: str) -> dict[str, Any] | None:
    """The `report` tool's one JSON object (its last line that is one: what comes before is noise of the shell)."""
    for line in reversed(text.splitlines()):
        try:
            reply = json.loads(line)
        except ValueError:
            continue
        if isinstance(reply, dict):
            return reply
    return None


# -- warmup --------------------------------------------------------------------------------------------
@dataclass
class MemoryReading:
    """One GPU's memory as nvidia-smi reads it after a warmup: `absent` when the target has no nvidia-smi."""

    used_mib: int | None = None
    absent: bool = False
    error: str | None = None
