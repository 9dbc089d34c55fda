"""A run's id, made by its launch (a run as read back is the wire's RunInfo, agent/wire/runinfo.py)."""

from __future__ import annotations

import time


def new_run_id(now: float | None = None) -> str:
    """Sortable and unique: 20261129-101500-3fa9c2."""
    import secrets

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{stamp}-{secrets.token_hex(3)}"
