"""The stacks of a real cold-cache hang and of a live compiled training on a real H200 (tools/real_stacks.py),
read back through gpuops' own code: the abort record reader (agent/run/stacks.recorded) and the stacks
parser (agent/wire/stackfile.parse). Skipped only while the record folder is absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.agent.run.stacks import recorded
from gpuops.agent.wire.records import read_json
from gpuops.agent.wire.stackfile import parse

REAL = Path(__file__).parent.parent / "data" / "real_h200" / "stacks"
COMPILING = ("torch/_dynamo", "torch/_inductor")

pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="no real-GPU stacks record yet (tools/real_stacks.py)")


def threads_of(case: str) -> list[list[dict]]:
    """Every recorded thread's frames of the case, read as gpuops reads them."""
    d = REAL / case
    rows = recorded(str(d))
    assert rows, f"no stacks recorded in {d}"
    out = []
    for row in rows:
        assert row["file"], row
        out += [t["frames"] for t in parse((Path(row["base"]) / row["file"]).read_text())]
    return out


def in_compile(frames: list[dict]) -> bool:
    return any(any(part in str(f["file"]) for part in COMPILING) for f in frames)


def test_the_hung_cold_compile_stalled_and_its_stacks_show_the_threads_inside_the_compile() -> None:
    done = read_json(str(REAL / "hang" / "abort-done.json"))
    assert done is not None and done["stacks"], done
    assert read_json(str(REAL / "hang" / "abort.json"))["reason"] == "stall"
    threads = threads_of("hang")
    compiling = [frames for frames in threads if in_compile(frames)]
    assert len(compiling) >= 1, [[f["function"] for f in t][:5] for t in threads]
    summary = [json.loads(ln) for ln in (REAL / "hang" / "gpuops.jsonl").read_text().splitlines() if ln.startswith("{")][-1]
    assert summary["exit_code"] == 8 and summary["stacks"] == done["stacks"]


def test_live_stacks_of_the_compiled_training_show_its_loop_and_the_run_ended_normally() -> None:
    events = [json.loads(ln) for ln in (REAL / "live" / "stacks.jsonl").read_text().splitlines() if ln.startswith("{")]
    taken = [e for e in events if e["event"] == "stacks"]
    assert taken and all(e["file"] for e in taken), taken
    functions = {f["function"] for e in taken for t in parse(e["text"]) for f in t["frames"]}
    assert "train" in functions, sorted(functions)
    summary = [json.loads(ln) for ln in (REAL / "live" / "gpuops.jsonl").read_text().splitlines() if ln.startswith("{")][-1]
    assert (summary["outcome"], summary["exit_code"]) == ("succeeded", 0), summary
