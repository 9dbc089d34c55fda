"""Test-only: hold an agent process at a named point, so a test can force a race window open.

Nothing in gpuops sets it; unset (always, outside the tests) `pause_at` is one `is None` test.
`GPUOPS_TEST_PAUSE_AT=name[,name=SECONDS]...` and `GPUOPS_TEST_PAUSE_DIR=DIR`: a process at `name`
writes DIR/name.reached (its pid, once per arrival) and waits until DIR/name.go exists (at most
120 s); `name=SECONDS` sleeps that long instead. The names are the comments at each call.
"""

from __future__ import annotations

import os
import time
from typing import Dict, Optional


def _points(spec: Optional[str]) -> Optional[Dict[str, Optional[float]]]:
    if not spec:
        return None
    out: Dict[str, Optional[float]] = {}
    for item in spec.split(","):
        name, _, seconds = item.strip().partition("=")
        out[name] = float(seconds) if seconds else None
    return out


_POINTS = _points(os.environ.get("GPUOPS_TEST_PAUSE_AT"))
_DIR = os.environ.get("GPUOPS_TEST_PAUSE_DIR") or "/tmp"


def pause_at(name: str) -> None:
    """Wait here when a test asked to (see the module's docstring); return at once otherwise."""
    if _POINTS is None or name not in _POINTS:
        return
    seconds = _POINTS[name]
    if seconds is not None:
        time.sleep(seconds)
        return
    with open(os.path.join(_DIR, name + ".reached"), "a") as fh:
        fh.write("%d\n" % os.getpid())
    deadline = time.monotonic() + 120.0
    while not os.path.exists(os.path.join(_DIR, name + ".go")) and time.monotonic() < deadline:
        time.sleep(0.02)
