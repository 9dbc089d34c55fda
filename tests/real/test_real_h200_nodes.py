"""A torchrun job over two nodes on the H200 (tools/real_nodes.py: real torchrun, gloo, the real FX race on
node 1 at step 8, nobody attached), read back through gpuops' own code: both nodes stopped with the job's
cause (node 1's rule), within 30 s of the fatal line; then both restarted together on <run>-a2 and finished.
Skipped while tests/data/real_h200/nodes/ is absent (the lead records it on the GPU machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.agent.wire.records import outcome
from gpuops.client.nodes import NodeEnd, job_outcome

RECORD = Path(__file__).resolve().parents[1] / "data" / "real_h200" / "nodes"
pytestmark = pytest.mark.skipif(not RECORD.is_dir(), reason="no real two-node record yet (tools/real_nodes.py)")


def read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def attempt_end(node: str, rank: int, d: Path) -> NodeEnd:
    exit_text = (d / "exit_code").read_text() if (d / "exit_code").exists() else None
    abort = read(d / "abort.json")
    state, code = outcome(exit_text, abort, False)
    return NodeEnd(node, rank, state.value, code, abort)


def test_node_1s_fx_race_ended_both_nodes_with_its_cause() -> None:
    ends = [attempt_end("ct200", 0, RECORD / "ct200" / "attempts" / "1"),
            attempt_end("ct201", 1, RECORD / "ct201" / "attempts" / "1")]
    out = job_outcome("job", ends)
    assert out.exit_code == 7 and out.data["first_failing_node"] == "ct201" and out.data["rule"] == "fx-tracing-race"
    assert ends[0].abort["reason"] == "job" and ends[0].abort["first_node"] == "ct201"
    assert "Detected that you are using FX to symbolically trace a dynamo-optimized function" in \
        (RECORD / "ct201" / "attempts" / "1" / "log").read_text()
    summary = read(RECORD / "summary.json")
    assert summary["backend"] == "gloo" and summary["fatal_line_to_last_session_gone_s"] < 30


def test_the_restart_ran_both_nodes_together_on_a_fresh_rendezvous_and_finished() -> None:
    run = read(RECORD / "summary.json")["run"]
    ends = [attempt_end("ct200", 0, RECORD / "ct200"), attempt_end("ct201", 1, RECORD / "ct201")]
    assert job_outcome(run, ends).exit_code == 0
    for node, rank in (("ct200", 0), ("ct201", 1)):
        assert (RECORD / node / "rdzv-id").read_text().strip() == f"{run}-a2"
        assert f"group {rank} rdzv {run}-a2" in (RECORD / node / "log").read_text()
        assert read(RECORD / node / "meta.json")["job"]["node_rank"] == rank
