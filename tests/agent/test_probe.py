"""The one-round-trip probe (gpuops/agent/sh/probe.sh): run by real bash over a real run directory,
parsed back into values."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from gpuops.agent.wire.marks import parse_probe as read_probe

PROBE = Path(__file__).resolve().parents[2] / "gpuops" / "agent" / "sh" / "probe.sh"


def _run_probe(home: Path, sessions: tuple[str, ...] | None, path: str = "/usr/bin:/bin") -> str:
    env = {"HOME": str(home), "PATH": path, "TMUX_TMPDIR": str(home / "tmux")}
    (home / "tmux").mkdir(exist_ok=True)
    bash = shutil.which("bash")
    return subprocess.run([bash, str(PROBE), *(sessions or ())], capture_output=True, text=True, env=env, check=True).stdout


def _bin_without_python(root: Path) -> Path:
    """A PATH folder with what the probe uses, except python3."""
    bindir = root / "bin-no-python"
    bindir.mkdir()
    for tool in ("date", "head", "tr", "cat", "stat", "tail", "rm", "tmux", "flock"):
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    return bindir


def _make_run(home: Path, session: str, run_id: str, **files: str) -> None:
    d = home / ".gpuops" / "runs" / run_id
    d.mkdir(parents=True)
    (home / ".gpuops" / "sessions").mkdir(parents=True, exist_ok=True)
    (home / ".gpuops" / "sessions" / session).write_text(run_id + "\n")
    for name, text in files.items():
        (d / name.replace("_json", ".json")).write_text(text)


def test_no_nvidia_smi_is_reported_not_failed(tmp_path: Path) -> None:
    probe = read_probe(_run_probe(tmp_path, ("train",)))
    assert probe.smi == "absent"
    assert probe.gpus == []
    assert probe.now is not None
    assert probe.sessions["train"].run is None and not probe.sessions["train"].alive


def test_reads_the_current_run_records(tmp_path: Path) -> None:
    meta = json.dumps({"id": "20261129-101500-abcdef", "playbook": "dflash-drafter", "phase": "running"})
    _make_run(tmp_path, "train", "20261129-101500-abcdef", meta_json=meta, log="step 1\nstep 2\n", exit_code="3\n")
    run = read_probe(_run_probe(tmp_path, ("train",))).sessions["train"].run
    assert run is not None
    assert run.run_id == "20261129-101500-abcdef"
    assert run.meta["playbook"] == "dflash-drafter"
    assert run.exit_code == 3 and run.state == "exited"
    assert run.log_size == len("step 1\nstep 2\n")
    assert run.seconds_since_log is not None and run.seconds_since_log < 60


def test_abort_record_decides_the_state(tmp_path: Path) -> None:
    abort = json.dumps({"reason": "match", "rule": "fx-tracing-race"})
    _make_run(tmp_path, "train", "20261129-101500-abcdef", meta_json="{}", log="", abort_json=abort)
    run = read_probe(_run_probe(tmp_path, ("train",))).sessions["train"].run
    assert run.state == "aborted" and run.outcome_code() == 7
    assert run.as_json()["last_match"] == "fx-tracing-race"


def test_without_a_playbook_every_session_is_listed(tmp_path: Path) -> None:
    _make_run(tmp_path, "a", "20261129-101500-aaaaaa", meta_json="{}", log="")
    _make_run(tmp_path, "b", "20261129-101500-bbbbbb", meta_json="{}", log="")
    assert set(read_probe(_run_probe(tmp_path, None)).sessions) == {"a", "b"}


def test_a_tampered_session_pointer_is_ignored_not_followed(tmp_path: Path) -> None:
    # The pointer leads out of the runs folder to a folder that looks like a run: followed, the
    # probe would report its records (and stop or logs would act on it).
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "meta.json").write_text('{"playbook": "not-a-run"}')
    (victim / "log").write_text("secret\n")
    assert (tmp_path / ".gpuops" / "runs" / ".." / ".." / "victim").resolve() == victim.resolve()
    (tmp_path / ".gpuops" / "runs").mkdir(parents=True)
    (tmp_path / ".gpuops" / "sessions").mkdir(parents=True)
    (tmp_path / ".gpuops" / "sessions" / "train").write_text("../../victim\n")
    state = read_probe(_run_probe(tmp_path, ("train",))).sessions["train"]
    assert state.run is None


def test_reports_the_watchdog_and_the_tools_a_run_needs(tmp_path: Path) -> None:
    import sys

    beat = json.dumps({"ts": 1.0, "state": "watching", "pid": 42, "restarts": 1})
    _make_run(tmp_path, "train", "20261129-101500-abcdef", meta_json="{}", log="", watchdog_json=beat)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    probe = read_probe(_run_probe(tmp_path, ("train",), path=f"{bindir}:/usr/bin:/bin"))
    assert probe.python == tuple(sys.version_info[:3])
    run = probe.sessions["train"].run
    assert run.watchdog["state"] == "watching" and run.watchdog_age is not None and run.watchdog_age > 1e6
    assert run.as_json()["watchdog"]["alive"] is False  # a heartbeat from 1970 is stale
    assert read_probe(_run_probe(tmp_path, ("train",), path=str(_bin_without_python(tmp_path)))).python is None


def test_nvidia_smi_failure_is_an_error_state(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")
    smi.chmod(0o755)
    probe = read_probe(_run_probe(tmp_path, ("x",), path=f"{bindir}:/usr/bin:/bin"))
    assert probe.smi == "error" and "couldn't communicate" in (probe.smi_error or "")


def test_an_abort_record_holding_a_long_escaped_line_still_names_its_rule(tmp_path: Path) -> None:
    # issue 19.12: a matched line of 20,000 NULs is 120 KB once JSON-escaped; the probe read 64 KiB of
    # abort.json, and every client said "rule 'None' matched (stopped by someone)"
    line = "\x00" * 20000 + " BOOM"
    abort = json.dumps({"reason": "match", "rule": "boom", "by": "watchdog", "line": line, "excerpt": line})
    assert len(abort) > 200_000
    _make_run(tmp_path, "train", "20261129-101500-abcdef", meta_json="{}", log="", abort_json=abort)
    run = read_probe(_run_probe(tmp_path, ("train",))).sessions["train"].run
    assert run.abort["rule"] == "boom" and run.abort["by"] == "watchdog" and run.abort["line"] == line
    assert run.state == "aborted" and run.outcome_code() == 7


def test_a_launch_between_saying_running_and_making_the_session_is_still_launching(tmp_path: Path) -> None:
    # The launcher records phase "running", then `start` makes the tmux session: a probe in between used to
    # call the run lost, and `logs -f` attached then ended at once with exit 6 (seen as a flaky test).
    import fcntl

    meta = json.dumps({"id": "20261129-101500-abcdef", "phase": "running"})
    _make_run(tmp_path, "train", "20261129-101500-abcdef", meta_json=meta, log="")
    locks = tmp_path / ".gpuops" / "locks"
    locks.mkdir(parents=True)
    with open(locks / "train.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the launch in progress holds its session's lock, as lock.sh does
        (locks / "train.holder").write_text("ops@laptop pid 4242\n")
        run = read_probe(_run_probe(tmp_path, ("train",))).sessions["train"].run
        assert run is not None and run.state == "warming" and run.alive
        # Once training's session was made, a missing session is a run that ended, lock or not.
        (tmp_path / ".gpuops" / "runs" / "20261129-101500-abcdef" / "started").write_text("1764583200.000\n")
        run = read_probe(_run_probe(tmp_path, ("train",))).sessions["train"].run
        assert run is not None and run.started and run.state == "lost"
    # And with no launch holding the lock, a run whose session is gone is lost, as before.
    (tmp_path / ".gpuops" / "runs" / "20261129-101500-abcdef" / "started").unlink()
    run = read_probe(_run_probe(tmp_path, ("train",))).sessions["train"].run
    assert run is not None and run.state == "lost"
