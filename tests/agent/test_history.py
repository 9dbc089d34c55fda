"""`gpuops runs` as the target works it out (agent/history.py) and as the CLI prints it (cli/commands/runs_cmd.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.agent.run.history import runs
from gpuops.cli.commands.runs_cmd import table


def make_run(home: Path, run_id: str, playbook: str, **meta: object) -> Path:
    d = home / ".gpuops" / "runs" / run_id
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"id": run_id, "playbook": playbook, **meta}))
    return d


def ended(home: Path, run_id: str, playbook: str, **profile: object) -> None:
    d = make_run(home, run_id, playbook)
    (d / "profile.json").write_text(json.dumps({"run": run_id, "playbook": playbook, "outcome": "succeeded",
                                                "exit_code": 0, **profile}))


def test_the_playbook_filter_comes_before_the_limit(tmp_path: Path) -> None:
    # issue 19.12: 20 runs of other playbooks, newer than X's two, hid them behind --limit
    ended(tmp_path, "20261201-090000-aaaaaa", "x")
    ended(tmp_path, "20261201-090100-bbbbbb", "x")
    for n in range(20):
        ended(tmp_path, "20261201-1%05d-cccccc" % n, "other")
    rows = runs(5, str(tmp_path), playbook="x")
    assert [r["run"] for r in rows] == ["20261201-090100-bbbbbb", "20261201-090000-aaaaaa"]
    assert len(runs(5, str(tmp_path))) == 5 and len(runs(1, str(tmp_path), playbook="x")) == 1


def test_an_interrupted_launch_is_exit_130_not_a_failed_training(tmp_path: Path) -> None:
    make_run(tmp_path, "20261201-090000-aaaaaa", "x", phase="interrupted")
    make_run(tmp_path, "20261201-090100-bbbbbb", "x", phase="warmup-failed", error="warmup timed out on GPU 5")
    make_run(tmp_path, "20261201-090200-cccccc", "x", phase="connection-lost")
    got = {r["run"]: (r["outcome"], r["exit_code"]) for r in runs(10, str(tmp_path))}
    assert got == {"20261201-090000-aaaaaa": ("interrupted", 130), "20261201-090100-bbbbbb": ("not-started", 5),
                   "20261201-090200-cccccc": ("not-started", 3)}


def test_the_table_shows_each_runs_findings(tmp_path: Path) -> None:
    # issue 19.6: a slow run that only warned succeeded: its findings say what it was
    ended(tmp_path, "20261201-090000-aaaaaa", "x", findings=["gpu-memory-shift", "throughput-drop"],
          throughput={"median": 98364.0, "n": 200})
    ended(tmp_path, "20261201-080000-bbbbbb", "x", findings=[], throughput={"median": 505695.0, "n": 200})
    lines = table("ct200", runs(10, str(tmp_path))).splitlines()
    assert "findings" in lines[0].split()
    slow, good = lines[1].split(), lines[2].split()
    assert "gpu-memory-shift,throughput-drop" in slow and "98k" in slow
    assert slow[slow.index("98k") - 1] == "gpu-memory-shift,throughput-drop" and good[good.index("506k") - 1] == "-"


def test_the_table_fits_a_60_column_terminal_and_a_pipe_gets_every_column(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    ended(tmp_path, "20261201-090000-aaaaaa", "x", findings=["gpu-memory-shift"], throughput={"median": 98364.0, "n": 200})
    rows = runs(10, str(tmp_path))
    full = table("ct200", rows).splitlines()
    assert len(full[0]) > 100 and "GPU memory MiB" in full[0]  # into a pipe: everything, as before
    narrow = table("ct200", rows, 60).splitlines()
    assert all(len(line) <= 60 for line in narrow), narrow
    assert narrow[0].split()[1:4] == ["run", "outcome", "exit"] and "20261201-090000-aaaaaa" in narrow[1]
    assert "columns hidden to fit" in capsys.readouterr().err
    assert table("ct200", rows, 300).splitlines() == full  # a wide terminal hides nothing
