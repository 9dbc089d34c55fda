"""Where a torchrun job hung: every node's summary in, one verdict out (the collective, who waits, who never came).

Before a stalled job's abort each node's watchdog summarizes its ranks (agent/run/hang_summary.py): each rank's
Flight Recorder as wire/flight.py reads it, and where its process was (the innermost frames of the training's
own code in its stacks). The nodes exchange those through torchrun's store (signed, agent/run/jobstore.py),
and each node reads the same verdict from them here: per process group, the newest collective some rank has
enqueued and not completed is the one the job waits in; the ranks of the group that never enqueued it never
arrived, and the node they are on is where the job hung. Without a recorder (an older torch, the recorder off)
the stacks say it more roughly: a rank whose main thread is inside torch.distributed waits in that call, a
rank outside it is elsewhere. Both sides read it (the client words it, a test reads a recorded job through
it). Standard library only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .stackfile import parse

#: How a frame's file tells library code from the training's own (what "where it was" names).
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "/torch/", "gpuops_agent", "/guard/pythonpath/")
#: A frame of torch.distributed: a rank whose main thread is in one waits in a collective (or a store call).
_DISTRIBUTED = "torch/distributed/"
#: Training frames kept per rank, innermost first.
FRAMES = 3
#: Notes a verdict keeps (it travels in abort-done.json, which `status` reads whole).
MAX_NOTES = 8


def _stdlib() -> frozenset:
    import sys

    return frozenset(getattr(sys, "stdlib_module_names", ("threading", "queue", "selectors", "socket", "subprocess",
                                                          "time", "multiprocessing", "concurrent", "asyncio")))


def training_frame(file: str) -> bool:
    """A frame of the training's own code (not the standard library, a package, torch, or gpuops). py-spy names a
    file by its path below sys.path (`torch/distributed/distributed_c10d.py`, `threading.py`), faulthandler in full;
    a native frame (`libc.so.6`) is no Python file."""
    if not file or file.startswith("<"):
        return False
    path = "/" + file.lstrip("/")
    if any(part in path for part in _LIBRARY):
        return False
    if "/" not in file:
        return file.endswith(".py") and file[:-3] not in _stdlib()
    return True


def _main_thread(threads: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """py-spy names it MainThread; faulthandler lists the newest thread first, so the main thread last."""
    named = [t for t in threads if t.get("name") == "MainThread"]
    if named:
        return named[0]
    return threads[-1] if threads else None


def where(text: str) -> Dict[str, Any]:
    """Where a process was, from its stacks text: its main thread's innermost training frames (innermost first),
    the innermost frame of all (what it was inside of), and whether that thread is inside torch.distributed."""
    threads = parse(text)
    main = _main_thread(threads)
    if main is None:
        return {}
    frames = main["frames"]
    own = [f for f in frames if training_frame(str(f.get("file") or ""))][:FRAMES]
    inside = frames[0] if frames else None
    # The call the training made into torch.distributed (all_reduce, barrier): where distributed_c10d defines the
    # collectives, else the outermost torch.distributed frame below the training's code but c10d_logger's wrapper.
    first_own = next((i for i, f in enumerate(frames) if training_frame(str(f.get("file") or ""))), len(frames))
    below = [f for f in frames[:first_own] if _DISTRIBUTED in str(f.get("file") or "")]
    dist = next((f for f in below if str(f.get("file")).endswith("distributed_c10d.py")), None) or next(
        (f for f in reversed(below) if f.get("function") != "wrapper"), below[-1] if below else None)
    return {"frames": own, "inside": inside, "distributed": dist["function"] if dist else None,
            "thread": main.get("name") or main.get("id")}


def frame_words(f: Dict[str, Any]) -> str:
    file = str(f.get("file") or "?").rsplit("/", 1)[-1]
    line = f.get("line")
    return "%s:%s in %s" % (file, line, f.get("function")) if line is not None else "%s in %s" % (file, f.get("function"))


def where_words(w: Dict[str, Any]) -> str:
    """`train.py:43 in main` (and what it was inside of, where that is no training frame)."""
    if not w or not (w.get("frames") or w.get("inside")):
        return ""
    own = w.get("frames") or []
    text = frame_words(own[0]) if own else "no frame of the training's own code"
    inside = w.get("inside")
    if inside and (not own or inside != own[0]):
        text += " (inside %s)" % (inside.get("function") if own else frame_words(inside))
    return text


# -- a node's summary ---------------------------------------------------------------------------------------------
def rank_row(rank: int, local_rank: Any, pid: int, stacks_text: str, flight: Optional[Dict[str, Any]],
             flight_on: bool = True) -> Dict[str, Any]:
    """One rank of a node's summary: where its process was (from its stacks' text) and its recorder (a helper's
    record as wire/flight.read_record gives it; None: no helper answered)."""
    rec = flight or {}
    error = (rec.get("error") or (None if flight is not None else "no Flight Recorder helper in the process "
                                  "(gpuops' PYTHONPATH folder was not first)")) if flight_on else None
    return {"rank": rank, "local_rank": local_rank, "pid": pid, "where": where(stacks_text or ""),
            "flight": rec.get("flight"), "flight_error": error}


def node_summary(node: str, node_rank: int, ranks: List[Dict[str, Any]], notes: List[str]) -> Dict[str, Any]:
    """What a node puts in the job's store before a stalled job's signal (the verdict reads every node's)."""
    notes = list(notes) + ([] if ranks else ["no rank of the job was running on this node"])
    return {"node": node, "node_rank": node_rank, "ranks": sorted(ranks, key=lambda r: r["rank"]), "notes": notes}


# -- the verdict ----------------------------------------------------------------------------------------------
def _ranks_of(summaries: Dict[int, Dict[str, Any]]) -> Dict[int, Tuple[str, Dict[str, Any]]]:
    """rank -> (its node, its row), over every node's summary; a rank two processes claim keeps the one whose
    recorder holds more (a spawned helper inherits RANK but made no process group)."""
    out: Dict[int, Tuple[str, Dict[str, Any]]] = {}
    for summary in summaries.values():
        for row in summary.get("ranks") or []:
            rank = row.get("rank")
            if not isinstance(rank, int):
                continue
            held = (out.get(rank, ("", {}))[1].get("flight") or {}).get("entries", -1)
            if rank not in out or ((row.get("flight") or {}).get("entries", -1) > held):
                out[rank] = (str(summary.get("node")), row)
    return out


def _pending(ranks: Dict[int, Tuple[str, Dict[str, Any]]]) -> Optional[Dict[str, Any]]:
    """The collective the job waits in by the recorders: per group, the newest one enqueued and not completed
    by some rank; of several groups, the one that has waited longest."""
    found = []
    groups = {g for _, row in ranks.values() for g in ((row.get("flight") or {}).get("groups") or {})}
    for g in sorted(groups):
        have = {r: (row["flight"]["groups"][g]) for r, (_, row) in ranks.items()
                if g in ((row.get("flight") or {}).get("groups") or {})}
        top = max(v["enqueued"] for v in have.values())
        waiting = sorted(r for r, v in have.items() if v["enqueued"] == top and v["completed"] < top)
        if not waiting or top <= 0:
            continue
        members = next((v["ranks"] for v in have.values() if v.get("ranks")), None) or sorted(ranks)
        behind = sorted(r for r, v in have.items() if v["enqueued"] < top)
        unknown = sorted(r for r in members if r not in have and r not in behind)
        entry = next((e for r in waiting for e in have[r]["last"] if e["seq"] == top), None) or {}
        found.append({"seq": top, "pg": g, "pg_desc": entry.get("pg_desc") or have[waiting[0]].get("desc"),
                      "op": entry.get("op"), "backend": entry.get("backend"), "sizes": entry.get("sizes"),
                      "created_ns": entry.get("created_ns"), "timeout_ms": entry.get("timeout_ms"),
                      "waiting": waiting, "missing": behind, "unknown": unknown,
                      "last": {r: have[r]["enqueued"] for r in behind}})
    if not found:
        return None
    return min(found, key=lambda c: (c["created_ns"] is None, c["created_ns"] or 0, c["seq"]))


def _by_stacks(ranks: Dict[int, Tuple[str, Dict[str, Any]]]) -> Optional[Dict[str, Any]]:
    """Without a recorder: ranks whose main thread is inside torch.distributed wait there; the others are elsewhere."""
    waiting = sorted(r for r, (_, row) in ranks.items() if (row.get("where") or {}).get("distributed"))
    others = sorted(r for r, (_, row) in ranks.items() if r not in waiting and (row.get("where") or {}).get("frames"))
    if not waiting:
        return None
    ops = sorted({str(ranks[r][1]["where"]["distributed"]) for r in waiting})
    return {"seq": None, "pg": None, "pg_desc": None, "op": "/".join(ops), "backend": None, "waiting": waiting,
            "missing": others, "unknown": [], "last": {}}


def verdict(summaries: Dict[int, Dict[str, Any]], nodes: Sequence[str]) -> Dict[str, Any]:
    """The job's verdict from the node summaries that came (node rank -> summary): the collective, the ranks
    waiting in it, the ranks that never arrived and where they were, the node to blame, and notes (a node whose
    summary did not come, a rank without a recorder)."""
    ranks = _ranks_of(summaries)
    notes = ["node %s's summary did not come (its watchdog did not answer in time)" % name
             for i, name in enumerate(nodes) if i not in summaries]
    for summary in summaries.values():
        notes += ["%s: %s" % (summary.get("node"), n) for n in summary.get("notes") or []]
    for r in sorted(ranks):
        node, row = ranks[r]
        if row.get("flight_error"):
            notes.append("rank %d (%s): no Flight Recorder dump: %s" % (r, node, row["flight_error"]))
    found = _pending(ranks)
    source = "flight-recorder"
    if found is None:
        found, source = _by_stacks(ranks), "stacks"
    out: Dict[str, Any] = {"source": source if found else None, "notes": notes[:MAX_NOTES]}
    if found is None:
        out["text"] = _nothing(ranks, notes)
        return out
    missing = [{"rank": r, "node": ranks[r][0], "last": found["last"].get(r),
                "where": where_words(ranks[r][1].get("where") or {})} for r in found["missing"]]
    blamed = sorted({m["node"] for m in missing})
    out.update(collective={k: found[k] for k in ("seq", "op", "pg", "pg_desc", "backend", "sizes", "timeout_ms")
                           if found.get(k) is not None},
               waiting=[{"rank": r, "node": ranks[r][0]} for r in found["waiting"]], missing=missing,
               unknown=found["unknown"], culprit_node=blamed[0] if len(blamed) == 1 else None)
    if out["culprit_node"] is not None and out["culprit_node"] in nodes:
        out["culprit_rank"] = list(nodes).index(out["culprit_node"])
    out["text"] = words(out)
    return out


def _nothing(ranks: Dict[int, Tuple[str, Dict[str, Any]]], notes: List[str]) -> str:
    if not ranks:
        return "no rank's record came: where the job hung is unknown" + ("; " + notes[0] if notes else "")
    at = "; ".join("rank %d (%s) at %s" % (r, ranks[r][0], where_words(ranks[r][1].get("where") or {}) or "?")
                   for r in sorted(ranks))
    return "no collective is pending in any rank's recorder and no rank waits in torch.distributed: " + at


def collective_words(c: Dict[str, Any]) -> str:
    """`all_reduce #6 of process group 0 (default_pg)`, or the call the stacks show."""
    if c.get("seq") is None:
        return "%s (from their stacks: no Flight Recorder)" % c.get("op")
    pg = "process group %s%s" % (c.get("pg"), " (%s)" % c["pg_desc"] if c.get("pg_desc") else "")
    return "%s #%s of %s" % (c.get("op"), c.get("seq"), pg)


def _list(rows: List[Dict[str, Any]]) -> str:
    nodes: Dict[str, List[int]] = {}
    for row in rows:
        nodes.setdefault(str(row["node"]), []).append(int(row["rank"]))
    return ", ".join("%s %s on %s" % ("rank" if len(rs) == 1 else "ranks", ", ".join(map(str, rs)), n)
                     for n, rs in nodes.items())


def words(v: Dict[str, Any]) -> str:
    """The verdict in one line a person reads."""
    c = v.get("collective") or {}
    text = "%s wait%s in %s" % (_list(v.get("waiting") or []), "s" if len(v.get("waiting") or []) == 1 else "",
                                collective_words(c))
    missing = v.get("missing") or []
    for m in missing:
        last = " (its last: #%s)" % m["last"] if m.get("last") is not None else ""
        at = "it was at " + m["where"] if m["where"] else "its stacks were not taken"
        text += "; rank %s on %s never arrived%s: %s" % (m["rank"], m["node"], last, at)
    if not missing:
        text += "; no rank is behind in its recorder"
    if v.get("unknown"):
        text += "; no record of rank(s) %s" % ", ".join(map(str, v["unknown"]))
    return text
