"""What a run's report is drawn from, in one reply: `python3 -m gpuops_agent report RUN` (or `-s SESSION`:
that session's current run) prints one JSON object built from the run directory's records.

The object holds the run's records (meta, profile, abort, attempt, the watchdog's telemetry and
baseline), the training start and warmup times (the target's clock, as the samples have), every
attempt's GPU and throughput samples thinned to at most ``MAX_POINTS``, the watchdog's events that
a report marks on its time axis, and the text of every attempt's stacks (stacks/<pid>.txt, and a
restarted run's attempts/<n>/stacks/<pid>.txt). A run that is not there prints
``{"error": "no-run", ...}`` with the newest run ids the target has. The report is drawn on the
client; nothing here is written.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

from ..detect.profile import build_profile
from ..detect.telemetry import Sample, read_samples
from ..system import tmux
from ..wire import protocol as p
from ..wire.records import read_json, read_text

#: Points per plotted series: a week of 2 s samples is 300,000; a plot is ~1,000 pixels wide.
MAX_POINTS = 1500
#: The events a report marks, and how many of them it keeps (the first and the last ones).
MARKED = frozenset({"match", "note", "stall", "abort_start", "aborted", "abort_completed", "stopped_elsewhere",
                    "restart", "attempt_started", "restart_failed", "restart_cancelled", "session_gone", "done", "hardware"})
MAX_EVENTS, KEEP_LAST = 400, 100
STACK_BYTES, MAX_STACKS, STACKS_TOTAL = 256 * 1024, 64, 4 << 20
KNOWN = 10  # run ids named when the one asked for is not there


def _float(text: Optional[str]) -> Optional[float]:
    try:
        return float(text.strip()) if text is not None else None
    except ValueError:
        return None


def _mtime(path: str) -> Optional[float]:
    try:
        return round(os.stat(path).st_mtime, 3)
    except OSError:
        return None


def _thin(samples: List[Sample], most: int = MAX_POINTS) -> List[Sample]:
    """Every k-th sample, so that at most `most` are left (the last always kept: where the run ended)."""
    if len(samples) <= most:
        return samples
    step = -(-len(samples) // most)
    return samples[::step][: most - 1] + samples[-1:]


def _row(s: Sample, attempt: int) -> List[Any]:
    """One sample as [t, {gpu: [MiB, %]}, throughput, attempt] (compact: a report may hold 1,500 of them)."""
    return [round(s.t, 2), {str(g): list(v) for g, v in sorted(s.gpus.items())}, s.throughput, attempt]


def _events(d: str) -> List[Dict[str, Any]]:
    kept: List[Dict[str, Any]] = []
    seen = 0
    try:
        with open(os.path.join(d, p.EVENTS), "rb") as fh:
            for raw in iter(lambda: fh.readline(1 << 20), b""):
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(ev, dict) or ev.get("event") not in MARKED:
                    continue
                seen += 1
                kept.append(ev)
                if len(kept) > MAX_EVENTS:  # keep the first ones and a window of the newest
                    del kept[MAX_EVENTS - KEEP_LAST]
    except OSError:
        pass
    if seen > len(kept):
        kept.insert(MAX_EVENTS - KEEP_LAST, {"event": "events_left_out", "count": seen - len(kept)})
    return kept


def _stacks(d: str, current: int) -> List[Dict[str, Any]]:
    """Every attempt's recorded stacks (attempts/<n>/stacks/ kept by a restart, then the current attempt's),
    oldest attempt first, each with its attempt, the text of its file and how it was taken. Bounded: MAX_STACKS
    files an attempt, STACK_BYTES a file, STACKS_TOTAL in all; past that an entry says `left_out`."""
    from .stacks import recorded

    out: List[Dict[str, Any]] = []
    per: Dict[int, int] = {}
    total = 0
    for row in recorded(d):
        n = got if isinstance(got := row.get("attempt"), int) else current
        per[n] = per.get(n, 0) + 1
        if per[n] > MAX_STACKS:
            continue
        entry = {k: row[k] for k in ("pid", "threads", "via", "error") if row.get(k) is not None}
        entry["attempt"] = n
        if row.get("file"):
            path = os.path.join(str(row["base"]), p.STACKS, os.path.basename(str(row["file"])))  # never outside it
            entry["file"] = os.path.relpath(path, d)
            if total >= STACKS_TOTAL:
                entry["left_out"] = True
            else:
                try:
                    with open(path, "rb") as fh:
                        data = fh.read(STACK_BYTES + 1)
                except OSError:
                    entry["error"] = entry.get("error") or "its file %s is gone" % entry["file"]
                    data = b""
                total += min(len(data), STACK_BYTES)
                entry.update(cut=len(data) > STACK_BYTES, text=data[:STACK_BYTES].decode("utf-8", "replace"))
        out.append(entry)
    return out


def _attempts(d: str, current: int) -> List[Dict[str, Any]]:
    """Each ended attempt's record (restart.py keeps it in attempts/<n>/attempt.json) with its training start."""
    out = []
    for n in range(1, current):
        sub = p.attempt_dir(d, n)
        rec = read_json(os.path.join(sub, p.ATTEMPT)) or {"attempt": n}
        rec["training_started"] = _float(read_text(os.path.join(sub, p.STARTED)))
        taken = (read_json(os.path.join(sub, p.ABORT_DONE)) or {}).get("stacks")
        if isinstance(taken, list):
            rec["stacks_taken"] = taken
        out.append(rec)
    return out


def collect(d: str) -> Dict[str, Any]:
    """The report's material from run directory `d` (see the module docstring)."""
    meta = read_json(os.path.join(d, p.META)) or {}
    attempt = read_json(os.path.join(d, p.ATTEMPT)) or {}
    n = got if isinstance(got := attempt.get("attempt"), int) else 1
    session = str(meta.get("session") or "")
    alive = bool(session) and tmux.alive(session)
    profile = read_json(os.path.join(d, p.PROFILE)) or build_profile(d, session_alive=alive)
    samples: List[List[Any]] = []
    for k in range(1, n + 1):
        where = d if k == n else p.attempt_dir(d, k)
        samples += [_row(s, k) for s in read_samples(where)]
    if len(samples) > MAX_POINTS:
        step = -(-len(samples) // MAX_POINTS)
        samples = samples[::step][: MAX_POINTS - 1] + samples[-1:]
    warmups = []
    for gpu, seconds in sorted((meta.get("warmup_seconds") or {}).items(), key=lambda kv: int(kv[0])):
        warmups.append({"gpu": int(gpu), "seconds": seconds, "end": _mtime(os.path.join(d, p.WARMUP_LOG % int(gpu)))})
    watchdog = read_json(os.path.join(d, p.WATCHDOG)) or {}
    return {
        "run": meta.get("id") or os.path.basename(os.path.normpath(d)),
        "now": round(time.time(), 3),
        "session_alive": alive,
        "meta": meta,
        "profile": profile,
        "attempt": attempt,
        "attempts": _attempts(d, n),
        "abort": read_json(os.path.join(d, p.ABORT)),
        "abort_done": read_json(os.path.join(d, p.ABORT_DONE)),
        "training_started": _float(read_text(os.path.join(d, p.STARTED))),
        "exit_code_at": _mtime(os.path.join(d, p.EXIT_CODE)),
        "telemetry": watchdog.get("telemetry"),
        "watchdog_state": watchdog.get("state"),
        "warmups": warmups,
        "samples": samples,
        "events": _events(d),
        "stacks": _stacks(d, n),
    }


def _known(home: str = "") -> List[str]:
    folder = os.path.join(p.state_dir(home or None), p.RUNS)
    try:
        return sorted((n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n))), reverse=True)[:KNOWN]
    except OSError:
        return []


def tool_report(argv: List[str]) -> int:
    if len(argv) == 2 and argv[0] == "-s":
        pointer = read_text(os.path.join(p.state_dir(), p.SESSIONS, argv[1])) or ""
        run_id = pointer.strip()
    elif len(argv) == 1:
        run_id = argv[0]
    else:
        sys.stderr.write("usage: report RUN | report -s SESSION\n")
        return 2
    try:
        d = p.run_dir(run_id)
    except ValueError:
        d = ""
    if not d or not os.path.isfile(os.path.join(d, p.META)):
        reply: Dict[str, Any] = {"error": "no-run", "run": run_id or None, "known": _known()}
    else:
        reply = collect(d)
    sys.stdout.write(json.dumps(reply, sort_keys=True, separators=(",", ":"), default=str) + "\n")
    return 0
