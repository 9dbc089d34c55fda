"""The one-round-trip probe: run by real bash over a real run directory, parsed back into values."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gpuops.command import bash
from gpuops.probe import parse_probe, probe_script


def _run_probe(home: Path, sessions: tuple[str, ...] | None, path: str = "/usr/bin:/bin") -> str:
    env = {"HOME": str(home), "PATH": path, "TMUX_TMPDIR": str(home / "tmux")}
    (home / "tmux").mkdir(exist_ok=True)
    return subprocess.run(bash(probe_script(sessions)).words(), capture_output=True, text=True, env=env, check=True).stdout


def _make_run(home: Path, session: str, run_id: str, **files: str) -> None:
    d = home / ".gpuops" / "runs" / run_id
    d.mkdir(parents=True)
    (home / ".gpuops" / "sessions").mkdir(parents=True, exist_ok=True)
    (home / ".gpuops" / "sessions" / session).write_text(run_id + "\n")
    for name, text in files.items():
        (d / name.replace("_json", ".json")).write_text(text)


def test_no_nvidia_smi_is_reported_not_failed(tmp_path: Path) -> None:
    probe = parse_probe(_run_probe(tmp_path, ("train",)))
    assert probe.smi == "absent"
    assert probe.gpus == []
    assert probe.now is not None
    assert probe.sessions["train"].run is None and not probe.sessions["train"].alive


def test_reads_the_current_run_records(tmp_path: Path) -> None:
    meta = json.dumps({"id": "20261129-101500-abcdef", "playbook": "dflash-drafter", "phase": "running"})
    _make_run(tmp_path, "train", "20261129-101500-abcdef", meta_json=meta, log="step 1\nstep 2\n", exit_code="3\n")
    run = parse_probe(_run_probe(tmp_path, ("train",))).sessions["train"].run
    assert run is not None
    assert run.run_id == "20261129-101500-abcdef"
    assert run.meta["playbook"] == "dflash-drafter"
    assert run.exit_code == 3 and run.state == "exited"
    assert run.log_size == len("step 1\nstep 2\n")
    assert run.seconds_since_log is not None and run.seconds_since_log < 60


def test_abort_record_decides_the_state(tmp_path: Path) -> None:
    abort = json.dumps({"reason": "match", "rule": "fx-tracing-race"})
    _make_run(tmp_path, "train", "20261129-101500-abcdef", meta_json="{}", log="", abort_json=abort)
    run = parse_probe(_run_probe(tmp_path, ("train",))).sessions["train"].run
    assert run.state == "aborted" and run.outcome_code() == 7
    assert run.as_json()["last_match"] == "fx-tracing-race"


def test_without_a_playbook_every_session_is_listed(tmp_path: Path) -> None:
    _make_run(tmp_path, "a", "20261129-101500-aaaaaa", meta_json="{}", log="")
    _make_run(tmp_path, "b", "20261129-101500-bbbbbb", meta_json="{}", log="")
    assert set(parse_probe(_run_probe(tmp_path, None)).sessions) == {"a", "b"}


def test_a_tampered_session_pointer_is_ignored_not_followed(tmp_path: Path) -> None:
    (tmp_path / ".gpuops" / "sessions").mkdir(parents=True)
    (tmp_path / ".gpuops" / "sessions" / "train").write_text("../../etc\n")
    state = parse_probe(_run_probe(tmp_path, ("train",))).sessions["train"]
    assert state.run is None


def test_nvidia_smi_failure_is_an_error_state(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")
    smi.chmod(0o755)
    probe = parse_probe(_run_probe(tmp_path, ("x",), path=f"{bindir}:/usr/bin:/bin"))
    assert probe.smi == "error" and "couldn't communicate" in (probe.smi_error or "")
