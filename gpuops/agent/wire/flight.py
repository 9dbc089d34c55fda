"""PyTorch's Flight Recorder as gpuops reads it: one rank's dump in, the few facts a hang verdict needs out.

A rank's recorder is dumped by gpuops' helper thread in the training process (agent/guard/flight.py) with
``torch._C._distributed_c10d._dump_fr_trace_json()``: JSON (bytes in torch 2.11), version "2.10", keys
``version``, ``entries``, ``pg_config``, ``pg_status``, ``nccl_comm_state``, ``comm_lib_version``. It holds no
rank number: the helper writes it beside the dump. Read on the H200 (tests/data/real_h200/flight_recorder/):
``pg_status`` per process group id, its counters as strings (``last_enqueued_collective`` "6",
``last_completed_collective`` "5"); each entry has ``collective_seq_id``, ``profiling_name``
(``gloo:all_reduce``), ``process_group`` (``["0", "default_pg"]``), ``state``, ``retired``, sizes, dtypes,
``time_created_ns``, ``timeout_ms``; ``pg_config`` is keyed by the group's name, which gloo leaves ``''``
(the stock analyzer, torchfrtrace, crashes on exactly that: ``KeyError: ('0', 0)``), its ``ranks`` a string
``"[0, 1]"``. So the dump is read here, with the standard library, tolerant of what a version spells
otherwise. Standard library only.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

#: The helper's record in the run's stacks/ folder: stacks/<pid>.flight.json (the rank, the dump or why none).
FLIGHT_SUFFIX = ".flight.json"
#: The helper's request pipe: stacks/<pid>.fr, a FIFO its thread waits on with a blocking open (no polling).
FIFO_SUFFIX = ".fr"
#: The recorder's buffer (entries per process group); the older name torch still reads when the new one is unset.
BUFFER_VAR, OLD_BUFFER_VAR = "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"
#: What gpuops sets the buffer to in a job whose env leaves both unset (the entries torch keeps per group:
#: 2000, as measured in REFERENCE.md, is minutes of steps at a few collectives a step).
BUFFER_DEFAULT = 2000
#: The environment of a torchrun worker that says which rank it is (a dump does not).
RANK_VARS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")
#: Entries kept per process group in a rank's summary (the pending one and the one before are what a verdict uses).
KEEP = 3


def _int(value: Any, default: Optional[int] = None) -> Optional[int]:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _ranks(value: Any) -> Optional[List[int]]:
    """A group's ranks as pg_config spells them: a list, or a string "[0, 1]"."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(r, int) for r in value):
        return [int(r) for r in value]
    return None


def op_of(profiling_name: Any) -> str:
    """`gloo:all_reduce` -> `all_reduce` (the backend is what comes before the colon)."""
    return str(profiling_name or "?").split(":", 1)[-1]


def backend_of(profiling_name: Any) -> Optional[str]:
    name = str(profiling_name or "")
    return name.split(":", 1)[0] if ":" in name else None


def _entry(e: Dict[str, Any]) -> Dict[str, Any]:
    pg = got if isinstance(got := e.get("process_group"), list) else [e.get("pg_id"), None]
    return {"seq": _int(e.get("collective_seq_id")), "op": op_of(e.get("profiling_name")),
            "backend": backend_of(e.get("profiling_name")), "pg": str(pg[0]) if pg and pg[0] is not None else "?",
            "pg_desc": str(pg[1]) if len(pg) > 1 and pg[1] is not None else None, "state": e.get("state"),
            "retired": bool(e.get("retired")), "sizes": e.get("input_sizes"), "dtypes": e.get("input_dtypes"),
            "created_ns": _int(e.get("time_created_ns")), "timeout_ms": _int(e.get("timeout_ms")),
            "p2p": bool(e.get("is_p2p"))}


def summarize(dump: Dict[str, Any]) -> Dict[str, Any]:
    """One rank's dump as a verdict reads it: per process group id, its counters, its ranks (where the config
    says them) and its last few collectives (newest last)."""
    entries = [_entry(e) for e in dump.get("entries") or [] if isinstance(e, dict)]
    configs = [c for c in (dump.get("pg_config") or {}).values() if isinstance(c, dict)]
    groups: Dict[str, Dict[str, Any]] = {}
    for pg_id, status in (dump.get("pg_status") or {}).items():
        if not isinstance(status, dict):
            continue
        mine = [e for e in entries if e["pg"] == str(pg_id) and not e["p2p"] and e["seq"] is not None]
        desc = next((e["pg_desc"] for e in reversed(mine) if e["pg_desc"]), None)
        groups[str(pg_id)] = {
            "enqueued": _int(status.get("last_enqueued_collective"), 0),
            "started": _int(status.get("last_started_collective"), -1),
            "completed": _int(status.get("last_completed_collective"), 0),
            "desc": desc, "ranks": _group_ranks(configs, str(pg_id), desc, len(dump.get("pg_status") or {})),
            "last": sorted(mine, key=lambda e: e["seq"])[-KEEP:]}
    return {"version": str(dump.get("version")), "groups": groups, "entries": len(entries)}


def _group_ranks(configs: List[Dict[str, Any]], pg_id: str, desc: Optional[str], groups: int) -> Optional[List[int]]:
    """The ranks of group `pg_id`: the config named by its id or its description; the only config where there is
    one group (gloo names it '')."""
    for c in configs:
        if str(c.get("name")) == pg_id or (desc and str(c.get("desc")) == desc):
            return _ranks(c.get("ranks"))
    if len(configs) == 1 and groups == 1:
        return _ranks(configs[0].get("ranks"))
    return None


def record_text(rank_env: Dict[str, str], pid: int, request: str, torch_version: Optional[str],
                dump: Optional[Any], error: Optional[str]) -> str:
    """What the helper writes: who it is, and the dump (parsed) or why there is none."""
    rec: Dict[str, Any] = {"pid": pid, "request": request, "torch": torch_version,
                           "buffer": rank_env.get(BUFFER_VAR) or rank_env.get(OLD_BUFFER_VAR)}
    for var in RANK_VARS:
        rec[var.lower()] = _int(rank_env.get(var))
    if error:
        rec["error"] = error
    else:
        rec["dump"] = dump
    return json.dumps(rec)


def read_record(text: str) -> Optional[Dict[str, Any]]:
    """A helper's record, with its dump summarized (None where it is no record)."""
    try:
        rec = json.loads(text)
    except ValueError:
        return None
    if not isinstance(rec, dict):
        return None
    dump = rec.pop("dump", None)
    if isinstance(dump, dict):
        rec["flight"] = summarize(dump)
        if not rec["flight"]["groups"] and not rec.get("error"):
            rec["error"] = ("its Flight Recorder holds no process group (%s unset: the recorder is off)" % BUFFER_VAR
                            if not rec.get("buffer") or str(rec.get("buffer")).strip() == "0"
                            else "its Flight Recorder holds no process group (none was made yet)")
    elif not rec.get("error"):
        rec["error"] = "the dump was not a JSON object"
    return rec
