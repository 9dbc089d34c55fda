"""Where a torchrun job hung, as gpuops' own code reads it (gpuops/agent/wire/flight.py, hang.py): a rank's Flight
Recorder dump as the lent GPU machine's torch 2.11 wrote it, a real two-node job's records (real torchrun and torch
2.13 on the CPU, tests/data/cpu_torch/nodes-hang/) read again into the verdict its watchdogs gave, the frames that
are the training's own in faulthandler's and py-spy's text, the verdict from stacks alone (no recorder), and what
a verdict says when a node's summary did not come."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuops.agent.wire import hang
from gpuops.agent.wire.flight import read_record, record_text

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_RECORD = DATA / "cpu_torch" / "nodes-hang"
H200_DUMPS = DATA / "real_h200" / "flight_recorder"
NODES = ["ct200", "ct201"]


def record_summaries(record: Path) -> dict[int, dict[str, Any]]:
    """Each node's summary from its recorded files alone: each rank's stacks text and its recorder's dump."""
    out = {}
    for rank, node in enumerate(NODES):
        b = json.loads((record / f"{node}.json").read_text())
        rows = []
        for row in b["abort_done"]["stacks"]:
            if not isinstance(row.get("rank"), int):
                continue  # torchrun's own agent
            pid = str(row["pid"])
            dump = b["flight"].get(pid)
            rows.append(hang.rank_row(row["rank"], row.get("local_rank"), row["pid"], b["stacks"].get(pid, ""),
                                      read_record(json.dumps(dump)) if dump is not None else None))
        out[rank] = hang.node_summary(node, rank, rows, [])
    return out


def test_a_real_jobs_records_read_again_give_the_verdict_its_watchdogs_gave() -> None:
    verdict = hang.verdict(record_summaries(CPU_RECORD), NODES)
    assert verdict["text"] == ("rank 0 on ct200 waits in all_reduce #6 of process group 0 (default_pg); rank 1 on "
                               "ct201 never arrived (its last: #5): it was at real_nodes_train.py:34 in load_batch")
    assert verdict["collective"]["timeout_ms"] == 105000 and verdict["culprit_node"] == "ct201", verdict
    for node in NODES:
        assert json.loads((CPU_RECORD / f"{node}.json").read_text())["abort_done"]["hang"] == verdict


def test_the_lent_gpu_machines_gloo_dumps_read_as_bytes_of_version_2_10_name_the_rank_behind() -> None:
    rows = {}
    for rank in (0, 1):
        dump = json.loads((H200_DUMPS / f"rank{rank}.json").read_bytes())  # _dump_fr_trace_json() gave bytes
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "WORLD_SIZE": "2"}
        rows[rank] = read_record(record_text(env, 100 + rank, "r", "2.11.0+cu130", dump, None))
    group = rows[0]["flight"]["groups"]["0"]
    assert (group["enqueued"], group["completed"], group["ranks"], group["desc"]) == (6, 5, [0, 1], "default_pg")
    assert rows[1]["flight"]["groups"]["0"]["enqueued"] == 5  # gloo names the group '' in pg_config: still its ranks
    summaries = {0: hang.node_summary("ct200", 0, [hang.rank_row(0, 0, 100, "", rows[0])], []),
                 1: hang.node_summary("ct201", 1, [hang.rank_row(1, 0, 101, "", rows[1])], [])}
    v = hang.verdict(summaries, NODES)
    assert (v["collective"]["op"], v["collective"]["seq"], v["collective"]["backend"]) == ("all_reduce", 6, "gloo")
    assert [(m["rank"], m["node"], m["last"]) for m in v["missing"]] == [(1, "ct201", 5)]
    assert v["text"].endswith("rank 1 on ct201 never arrived (its last: #5): its stacks were not taken"), v["text"]


PYSPY = """Thread 4242 (idle): "MainThread"
    clock_nanosleep (libc.so.6)
    sleep (time.py:1)
    load_batch (train.py:8)
    main (train.py:20)
    <module> (train.py:30)
Thread 4250 (idle): "gpuops-flight-recorder"
    _serve (gpuops_agent/guard/flight_helper.py:65)
"""
PYSPY_WAITING = """Thread 77 (active): "MainThread"
    wait (threading.py:331)
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    wrapper (torch/distributed/c10d_logger.py:83)
    step (model/loop.py:41)
    main (train.py:20)
"""


def test_where_a_process_was_is_its_main_threads_innermost_frame_of_the_training_in_either_tools_text() -> None:
    b = json.loads((CPU_RECORD / "ct201.json").read_text())
    faulthandler = next(t for t in b["stacks"].values() if "load_batch" in t)  # CPython 3.11's, main thread last
    assert hang.where_words(hang.where(faulthandler)) == "real_nodes_train.py:34 in load_batch"
    assert hang.where_words(hang.where(PYSPY)) == "train.py:8 in load_batch (inside clock_nanosleep)"
    waiting = hang.where(PYSPY_WAITING)
    assert waiting["distributed"] == "all_reduce" and hang.where_words(waiting).startswith("loop.py:41 in step")


def test_without_a_recorder_the_stacks_say_who_waits_in_torch_distributed_and_who_is_elsewhere() -> None:
    no_fr = {"error": "torch 2.4.0 has no Flight Recorder (no _dump_fr_trace_json)"}
    summaries = {0: hang.node_summary("ct200", 0, [hang.rank_row(0, 0, 7, PYSPY_WAITING, no_fr)], []),
                 1: hang.node_summary("ct201", 1, [hang.rank_row(1, 0, 8, PYSPY, no_fr)], [])}
    v = hang.verdict(summaries, NODES)
    assert v["source"] == "stacks" and v["culprit_node"] == "ct201", v
    assert v["text"] == ("rank 0 on ct200 waits in all_reduce (from their stacks: no Flight Recorder); rank 1 on ct201 "
                         "never arrived: it was at train.py:8 in load_batch (inside clock_nanosleep)")
    assert v["notes"] == [f"rank {r} ({n}): no Flight Recorder dump: {no_fr['error']}" for r, n in ((0, "ct200"), (1, "ct201"))]


def test_a_node_whose_summary_did_not_come_is_said_and_its_ranks_are_not_blamed() -> None:
    only = {0: record_summaries(CPU_RECORD)[0]}
    v = hang.verdict(only, NODES)
    assert v["notes"] == ["node ct201's summary did not come (its watchdog did not answer in time)"], v
    assert v["missing"] == [] and v["unknown"] == [1] and v["culprit_node"] is None, v
    assert v["text"].endswith("no rank is behind in its recorder; no record of rank(s) 1"), v["text"]
