"""The run history of this target: `python3 -m gpuops_agent runs LIMIT`, one JSON object a line, newest first.

Each run's profile (profile.json, written by its watchdog when it ended); for a run without one
(still running, or it ended without its watchdog) the same figures are worked out from its
records now, without writing anything.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List

from . import protocol as p
from .profile import build_profile
from .records import read_json
from . import tmux


def runs(limit: int, home: str = "") -> List[Dict[str, Any]]:
    folder = os.path.join(p.state_dir(home or None), p.RUNS)
    try:
        names = sorted((n for n in os.listdir(folder) if _is_run_id(n)), reverse=True)[:limit]
    except OSError:
        return []
    out = []
    for name in names:
        d = os.path.join(folder, name)
        profile = read_json(os.path.join(d, p.PROFILE))
        if profile is None:
            meta = read_json(os.path.join(d, p.META)) or {}
            alive = bool(meta.get("session")) and tmux.alive(str(meta["session"]))
            profile = build_profile(d, session_alive=alive)
            if meta.get("phase") in ("preflight", "warmup"):
                profile["outcome"], profile["exit_code"] = "warming", None
            elif meta.get("phase") in ("warmup-failed", "start-failed", "interrupted", "connection-lost"):
                profile["outcome"] = "not-started"
                profile["exit_code"] = 5 if meta.get("phase") == "warmup-failed" else 6
                profile["error"] = meta.get("error")
        profile.setdefault("session", (read_json(os.path.join(d, p.META)) or {}).get("session"))
        out.append(profile)
    return out


def _is_run_id(name: str) -> bool:
    try:
        p.check_run_id(name)
    except ValueError:
        return False
    return True


def main(argv: List[str]) -> int:
    limit = int(argv[0]) if argv else 20
    for profile in runs(limit):
        sys.stdout.write(json.dumps(profile, sort_keys=True, separators=(",", ":")) + "\n")
    return 0


tool_runs = main
