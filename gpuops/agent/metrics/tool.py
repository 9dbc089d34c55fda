"""`python3 -m gpuops_agent metrics [PLAYBOOK]`: every run of this target that goes on, and every one that ended
within its `watch.metrics.keep_ended` (600 s by default), as one JSON line each (RunSnapshot.plain), newest first:
what `gpuops metrics` renders (agent/wire/metric_table.py) or prints with --json.

Read now, from the records (reading.py), with the heartbeat's age at this moment. A run counts as going on while
its watchdog beats (or, its watchdog gone, while its tmux session lives), or while its launch holds the launch
lock (preflight, warmup). Nothing is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

from ..system import tmux
from ..wire import protocol as p
from ..wire import watchfile
from ..wire.records import read_json
from .reading import Reader

#: events.jsonl read at most this much per run (a scrape must not read a run's whole history for ever).
READ_LIMIT = 1 << 26


def _locked(session: str, home: Optional[str] = None) -> bool:
    """The launch lock of the session is held: its launch is in preflight or warmup (lock.sh)."""
    try:
        fh = open(os.path.join(p.state_dir(home), p.LOCKS, session + ".lock"), "r")
    except OSError:
        return False
    try:
        fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        fh.close()


def _current(session: str, home: Optional[str]) -> str:
    """The run id the session's record names: only that run of a session can still go on."""
    try:
        with open(os.path.join(p.state_dir(home), p.SESSIONS, session), encoding="utf-8") as fh:
            return fh.read(200).strip()
    except OSError:
        return ""


def live(run: str, meta: Dict[str, Any], beat: Dict[str, Any], now: float, home: Optional[str] = None) -> bool:
    """The run (or its launch) goes on: its watchdog beats, or (its watchdog gone) it is its session's current
    run and the session lives, or its launch holds the launch lock."""
    if beat.get("state") == "done" or meta.get("phase") in p.NOT_STARTED_PHASES:
        return False
    ts = beat.get("ts")
    if isinstance(ts, (int, float)) and now - ts < p.HEARTBEAT_STALE:
        return True
    session = str(meta.get("session") or "")
    if not session or _current(session, home) != run:
        return False
    if meta.get("phase") in p.WARMING_PHASES and not beat:
        return _locked(session, home)
    return tmux.alive(session)


def _is_run_id(name: str) -> bool:
    try:
        p.check_run_id(name)
    except ValueError:
        return False
    return True


def snapshots(now: float, playbook: Optional[str] = None, home: Optional[str] = None) -> List[Dict[str, Any]]:
    folder = os.path.join(p.state_dir(home), p.RUNS)
    try:
        names = sorted((n for n in os.listdir(folder) if _is_run_id(n)), reverse=True)
    except OSError:
        return []
    out = []
    for name in names:
        d = os.path.join(folder, name)
        meta = read_json(os.path.join(d, p.META))
        if meta is None or (playbook is not None and meta.get("playbook") != playbook):
            continue
        cfg = watchfile.read_or_default(d)
        beat = read_json(os.path.join(d, p.WATCHDOG)) or {}
        going = live(name, meta, beat, now, home)
        reader = Reader(d, cfg)
        if not going:
            _, _, ended = reader.state(beat, False)
            if ended is None or now - ended > cfg.metrics.keep_ended:
                continue
        snap = reader.snapshot(now, beat, going, at_scrape=True, read_limit=READ_LIMIT)
        out.append({"schema_version": p.SCHEMA_VERSION, **snap.plain()})
    return out


def main(argv: List[str]) -> int:
    now = time.time()
    for snap in snapshots(now, argv[0] if argv else None):
        sys.stdout.write(json.dumps(snap, sort_keys=True, separators=(",", ":")) + "\n")
    return 0


tool_metrics = main
