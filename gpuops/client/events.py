"""Events the core yields; the CLI renders them as text, rich output or JSON lines."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Event:
    """One thing that happened: `kind` names it, `data` carries its fields (JSON-safe)."""

    kind: str
    target: str
    run: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
    #: Read from a record a newer gpuops wrote: its fields may be ones this gpuops does not know (shown as
    #: recorded: `--json` prints it as an `unknown_event`).
    newer: bool = False

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


@dataclass
class Outcome:
    """How a command ended: the exit code and what to say about it."""

    outcome: str
    exit_code: int
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
