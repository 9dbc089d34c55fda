"""What the abort sequence takes before its signal, while every process of the training still lives.

- The training's thread stacks (run/stacks.py), where watch.stacks asks: `on_stall` (the default) before a
  stall's abort, and on a node of a torchrun job also when another node's stall or failure ended the job
  (every node's stacks are where the job hung); `always` before every abort.
- On a node of a torchrun job stopped for a stall (its own, or another node's), each rank's Flight Recorder
  (run/flight_ask.py, unless torchrun.flight_recorder is false), then this node's summary (its ranks, where
  each was, their recorders), exchanged with every other node through the job's store (the watchdog's job
  link gathers them, bounded), and the job's verdict read from them (wire/hang.py). Every node reads the
  same summaries, so every node's abort record says the same verdict, also with nobody attached.

Whatever fails here is said and the abort goes on.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..wire import hang
from ..wire import protocol as p
from ..wire.records import read_json, read_text
from ..wire.watchfile import WatchConfig

#: gather(summary) -> every node's summary that came (node rank -> summary): the watchdog's job link's.
Gather = Callable[[Dict[str, Any]], Dict[int, Dict[str, Any]]]


def _causes(d: str) -> Tuple[Optional[str], Optional[str]]:
    """(abort.json's reason, the job's first node's reason where another node ended the job)."""
    abort = read_json(os.path.join(d, p.ABORT)) or {}
    reason = abort.get("reason")
    return reason, (abort.get("first_reason") if reason == p.JOB_ABORT else None)


def take(d: str, cfg: WatchConfig, run_id: str, gather: Optional[Gather] = None
         ) -> Tuple[Optional[List[Dict[str, Any]]], Optional[Dict[str, Any]]]:
    """(the stacks taken, None where not asked; the job's verdict, None where none is read)."""
    from .stacks import take as take_stacks
    from .stacks import wanted

    reason, first = _causes(d)
    stacks = None
    if wanted(cfg.stacks, reason, first):
        try:
            stacks = take_stacks(d, run_id)
        except Exception as exc:  # the abort goes on whatever the stacks do
            stacks = [{"pid": 0, "file": None, "threads": 0, "via": None, "error": "%s: %s" % (type(exc).__name__, exc)}]
    if cfg.job is None or p.RESTART_STALL not in (reason, first):
        return stacks, None
    try:
        summary = node_summary(d, cfg, run_id, stacks)
        summaries = gather(summary) if gather is not None else {cfg.job.node_rank: summary}
        return stacks, hang.verdict(summaries, list(cfg.job.nodes))
    except Exception as exc:  # the verdict is a convenience; the abort is not
        return stacks, {"source": None, "notes": [], "text": "no verdict: %s: %s" % (type(exc).__name__, exc)}


def node_summary(d: str, cfg: WatchConfig, run_id: str, stacks: Optional[List[Dict[str, Any]]]) -> Dict[str, Any]:
    """This node's part of the verdict: each rank's process, where it was (its stacks), its recorder."""
    from .flight_ask import ask
    from .stacks import python_pids, rank_env

    job = cfg.job
    assert job is not None
    folder = os.path.join(d, p.STACKS)
    rows = {int(r["pid"]): r for r in stacks or [] if isinstance(r.get("pid"), int) and r.get("pid")}
    pids = sorted(set(rows) | set(python_pids(folder, run_id)))
    notes: List[str] = []
    flights: Dict[int, Dict[str, Any]] = {}
    if job.flight_recorder:
        flights = ask(folder, pids)
    else:
        notes.append("the Flight Recorder is off (torchrun.flight_recorder: false)")
    if stacks is None:
        notes.append("no stacks taken (watch.stacks: off)")
    ranks = []
    for pid in pids:
        env = rank_env(pid)
        rec = flights.get(pid)
        rank = (rec or {}).get("rank") if isinstance((rec or {}).get("rank"), int) else env.get("rank")
        if not isinstance(rank, int):
            continue  # torchrun's own agent, a helper process: no rank
        row = rows.get(pid) or {}
        text = read_text(os.path.join(d, str(row["file"])), 4 << 20) if row.get("file") else None
        ranks.append(hang.rank_row(rank, (rec or {}).get("local_rank", env.get("local_rank")), pid, text or "", rec,
                                   job.flight_recorder))
    return hang.node_summary(job.node_name, job.node_rank, ranks, notes)
