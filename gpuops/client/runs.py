"""Run ids, made here, and records as one line of JSON; a run as read back is the wire's RunInfo
(agent/wire/runinfo.py)."""

from __future__ import annotations

import json
import time
from typing import Any


def new_run_id(now: float | None = None) -> str:
    """Sortable and unique: 20261129-101500-3fa9c2."""
    import secrets

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"


def dumps(record: dict[str, Any]) -> str:
    """A record as one line of JSON (so it can travel inside a shell word)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))
