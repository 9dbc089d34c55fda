"""A hung torchrun job on the lent GPU machine (tools/real_nodes.py --hang: real torchrun and torch, gloo, two nodes,
node 1's rank never joins its 6th all_reduce, nobody attached), read again through gpuops' own diagnosis code:
each node's recorded stacks and Flight Recorder dumps (as its helper thread wrote them in the training's torch)
make the node's summary, and the verdict read from both names the collective, the rank that never arrived, its
node and where it was, as the watchdogs said on the machine. Skipped while tests/data/real_h200/nodes-hang/ is
absent (the lead records it on the GPU machine: the command is in tools/real_hang.py's docstring)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_hang_verdict import NODES, record_summaries

from gpuops.agent.wire import hang
from gpuops.agent.wire.records import outcome
from gpuops.client.nodes import NodeEnd, job_outcome

RECORD = Path(__file__).resolve().parents[1] / "data" / "real_h200" / "nodes-hang"
pytestmark = pytest.mark.skipif(not (RECORD / "summary.json").is_file(),
                                reason="no real hung-job record yet: the lead runs `tools/real_nodes.py OUT --hang` on "
                                       "the GPU machine and keeps OUT/nodes-hang/ as tests/data/real_h200/nodes-hang/")


def bundle(node: str) -> dict[str, Any]:
    return json.loads((RECORD / f"{node}.json").read_text())


def test_the_verdict_read_from_both_nodes_records_names_the_collective_the_missing_rank_its_node_and_where() -> None:
    verdict = hang.verdict(record_summaries(RECORD), NODES)  # as the CPU record is read (test_hang_verdict)
    assert verdict["source"] == "flight-recorder", verdict
    c = verdict["collective"]
    assert (c["op"], c["seq"], c["pg"], c["backend"]) == ("all_reduce", 6, "0", "gloo"), c
    stall = json.loads((RECORD / "summary.json").read_text())["stall_timeout"]
    assert c["timeout_ms"] == (stall + 60) * 1000, c  # the job's timeout, set through gpuops' sitecustomize
    assert verdict["waiting"] == [{"rank": 0, "node": "ct200"}], verdict
    (missing,) = verdict["missing"]
    assert (missing["rank"], missing["node"], missing["last"]) == (1, "ct201", 5), missing
    assert missing["where"].startswith("real_nodes_train.py:") and "in load_batch" in missing["where"], missing
    assert verdict["culprit_node"] == "ct201", verdict
    # What each node's watchdog said on the machine, with nobody attached, is what gpuops reads from the records.
    for node in NODES:
        assert bundle(node)["abort_done"]["hang"] == verdict, node


def test_both_nodes_stopped_for_the_stall_and_the_job_names_the_missing_ranks_node_first() -> None:
    ends = []
    for rank, node in enumerate(NODES):
        b = bundle(node)
        state, code = outcome(None, b["abort"], False)
        assert state.value == "stalled" and code == 8, (node, b["abort"])
        ends.append(NodeEnd(node, rank, state.value, code, b["abort"], b["abort_done"]["hang"]))
    out = job_outcome("job", ends)
    assert out.exit_code == 8 and out.data["first_failing_node"] == "ct201", out
    follow = [json.loads(x) for x in (RECORD / "logs-follow.jsonl").read_text().splitlines() if x.startswith("{")]
    assert follow[-1]["first_failing_node"] == "ct201" and follow[-1]["exit_code"] == 8, follow[-1]
    notified = [json.loads(x) for x in (RECORD / "notified.jsonl").read_text().splitlines()]
    assert {p["target"] for p in notified} == set(NODES)
    assert all("rank 1 on ct201 never arrived" in p["text"] for p in notified), notified
    stacks = (RECORD / "logs-stacks.txt").read_text()
    assert "(rank 0)" in stacks and "(rank 1)" in stacks and "in load_batch" in stacks, stacks[-2000:]
