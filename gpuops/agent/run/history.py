"""The run history of this target: `python3 -m gpuops_agent runs LIMIT [PLAYBOOK]`, one JSON object a line,
newest first: the LIMIT newest runs (of PLAYBOOK, when given: the filter comes before the limit).

Each run's profile (profile.json, written by its watchdog when it ended); for a run without one
(still running, or it ended without its watchdog) the same figures are worked out from its
records now, without writing anything.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List

from ..detect.profile import build_profile
from ..system import tmux
from ..wire import protocol as p
from ..wire.records import outcome, read_json, read_text
from ..wire.verdict import record_view


def runs(limit: int, home: str = "", playbook: str | None = None) -> List[Dict[str, Any]]:
    folder = os.path.join(p.state_dir(home or None), p.RUNS)
    try:
        names = sorted((n for n in os.listdir(folder) if _is_run_id(n)), reverse=True)
    except OSError:
        return []
    out: List[Dict[str, Any]] = []
    for name in names:
        if len(out) >= limit:
            break
        d = os.path.join(folder, name)
        meta = read_json(os.path.join(d, p.META)) or {}
        if playbook is not None and meta.get("playbook") != playbook:
            continue
        profile = read_json(os.path.join(d, p.PROFILE))
        if profile is None:
            alive = bool(meta.get("session")) and tmux.alive(str(meta["session"]))
            profile = build_profile(d, session_alive=alive)
            if meta.get("phase") in p.WARMING_PHASES:
                profile["outcome"], profile["exit_code"] = p.RunState.WARMING, None
            elif meta.get("phase") in p.NOT_STARTED_EXIT:
                interrupted = meta["phase"] == p.PHASE_INTERRUPTED
                profile["outcome"] = p.RunState.INTERRUPTED if interrupted else p.RunState.NOT_STARTED
                profile["exit_code"] = p.NOT_STARTED_EXIT[meta["phase"]]
                profile["error"] = meta.get("error")
        hardware = read_json(os.path.join(d, p.HARDWARE))
        if hardware is not None and profile.get("outcome") != p.RunState.HARDWARE:  # written after the profile (a
            # following client put the run's end down to an Xid): the one outcome mapping decides again
            name, code = outcome(read_text(os.path.join(d, p.EXIT_CODE)), read_json(os.path.join(d, p.ABORT)), False,
                                 hardware)
            profile.update(outcome=name, exit_code=code, rule=hardware.get("rule") or profile.get("rule"))
        if hardware is not None:
            profile["hardware"] = record_view(hardware)
        profile.setdefault("session", meta.get("session"))
        if isinstance(meta.get("job"), dict):  # a node of a torchrun job: its place, and the node that ended it
            profile["job"] = _job(d, meta["job"])
        out.append(profile)
    return out


def _job(d: str, job: Dict[str, Any]) -> Dict[str, Any]:
    out = {k: job.get(k) for k in ("id", "node_rank", "nodes")}
    abort = read_json(os.path.join(d, p.ABORT)) or {}
    if abort.get("reason") == p.JOB_ABORT:
        out.update(ended_by_node=abort.get("first_node"), ended_by_rank=abort.get("first_rank"))
    hang = (read_json(os.path.join(d, p.ABORT_DONE)) or {}).get("hang")
    if isinstance(hang, dict):  # a stalled job: where it hung; its culprit is the job's first failing node
        out["hang"] = hang
        if hang.get("culprit_node"):
            out.update(ended_by_node=hang["culprit_node"], ended_by_rank=hang.get("culprit_rank"))
    return out


def _is_run_id(name: str) -> bool:
    try:
        p.check_run_id(name)
    except ValueError:
        return False
    return True


def main(argv: List[str]) -> int:
    limit = int(argv[0]) if argv else 20
    for profile in runs(limit, playbook=argv[1] if len(argv) > 1 else None):
        sys.stdout.write(json.dumps(profile, sort_keys=True, separators=(",", ":")) + "\n")
    return 0


tool_runs = main
