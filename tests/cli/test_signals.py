"""SIGTERM (a CI job cancelled) while gpuops follows a run: handled as Ctrl-C is, exit 143, with the JUnit
report and the JSON summary written, and the run left alive for its watchdog. A real gpuops subprocess
gets the signal mid-follow; CT 200 and CT 201 behind the real sshd, real tmux.
"""

from __future__ import annotations

import json
import signal
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_multi_target import GO_TRAIN, Fleet, detach_both, fleet  # noqa: F401 - the fixture


def hang_everywhere(fleet: Fleet) -> None:
    for vmid in (200, 201):
        fleet.fake.set_env(vmid, MODE="hang", GO=str(fleet.dir / "never"))
    fleet.write(GO_TRAIN)


def junit_errors(path: Path) -> dict[str, tuple[str, str]]:
    """Per testsuite (target): the training testcase's verdict (tag, type)."""
    out = {}
    for suite in ET.parse(path).getroot():
        (training,) = [c for c in suite if c.get("name") == "training"]
        verdict = [v for v in training if v.tag in ("error", "failure", "skipped")]
        out[suite.get("name")] = (verdict[0].tag, verdict[0].get("type", "")) if verdict else ("passed", "")
    return out


def test_sigterm_while_launch_follows_writes_the_report_and_summary_and_exits_143(fleet: Fleet) -> None:
    hang_everywhere(fleet)
    report = fleet.dir / "report.xml"
    launch = fleet.start("launch", "ct201", extra=("--json", "--junit", str(report)))
    launch.wait_for(lambda: '"event": "log"' in launch.out, "training to be followed")
    launch.signal(signal.SIGTERM)
    result = launch.finish()
    assert result.code == 143, result
    summary = result.events()[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"], summary["run_alive"]) == (
        "summary", "terminated", 143, True)
    assert summary["run"] == fleet.run_id(201) and "Reattach with: gpuops logs -f" in summary["message"]
    assert junit_errors(report) == {"ct201": ("error", "terminated")}
    assert fleet.alive(201)  # as after Ctrl-C: the run goes on, its watchdog guards it
    assert fleet.run("stop", "ct201").code == 0


def test_sigterm_while_logs_follows_several_targets_ends_each_and_exits_143(fleet: Fleet) -> None:
    detach_both(fleet, {200: "hang", 201: "hang"})
    report = fleet.dir / "report.xml"
    follow = fleet.start("logs", "ct200", "ct201", extra=("--follow", "--junit", str(report)))
    follow.wait_for(lambda: "\nct200: step " in follow.out and "\nct201: step " in follow.out, "both logs followed")
    follow.signal(signal.SIGTERM)
    result = follow.finish()
    assert result.code == 143, result
    for t in ("ct200", "ct201"):
        assert f"[{t}] TERMINATED (exit 143): terminated (SIGTERM): stopped following; the run is still alive" in result.err
    assert "ct200 terminated (exit 143), ct201 terminated (exit 143); exit 143" in result.err
    assert junit_errors(report) == {"ct200": ("error", "terminated"), "ct201": ("error", "terminated")}
    assert fleet.alive(200) and fleet.alive(201)
    assert fleet.run("stop", "ct200", "ct201").code == 0


def training(fleet: Fleet, vmid: int) -> list[int]:
    """The container's live training processes."""
    def line(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""
    return [pid for pid in fleet.fake.processes(vmid) if b"fake-train" in line(pid)]


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGHUP, 129, "hangup")])
def test_a_cancelled_ci_job_stops_its_run_with_stop_on_exit(fleet: Fleet, sig: int, code: int, word: str) -> None:
    """SIGTERM (a cancelled job) or SIGHUP (the runner's session closed) to `launch --stop-on-exit`: the run is
    stopped first, as `gpuops stop` stops it (no session, no training process left), then the signal's code."""
    hang_everywhere(fleet)
    launch = fleet.start("launch", "ct201", extra=("--json", "--stop-on-exit"))
    launch.wait_for(lambda: '"event": "log"' in launch.out, "training to be followed")
    assert fleet.alive(201) and training(fleet, 201)
    launch.signal(sig)
    result = launch.finish()
    assert result.code == code, result
    summary = result.events()[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"], summary["run_alive"]) == (
        "summary", word, code, False)
    assert "--stop-on-exit" in summary["message"] and "stopped" in summary["message"], summary
    assert not fleet.alive(201) and training(fleet, 201) == []
    assert json.loads((fleet.run_dir(201) / "abort.json").read_text())["by"] == "stop"


def test_sighup_ends_a_follow_with_its_summary_and_129_the_run_alive(fleet: Fleet) -> None:
    """Without --stop-on-exit a SIGHUP is handled as Ctrl-C is: a summary, the reattach hint, exit 129."""
    hang_everywhere(fleet)
    report = fleet.dir / "report.xml"
    launch = fleet.start("launch", "ct201", extra=("--json", "--junit", str(report)))
    launch.wait_for(lambda: '"event": "log"' in launch.out, "training to be followed")
    launch.signal(signal.SIGHUP)
    result = launch.finish()
    assert result.code == 129, result
    summary = result.events()[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"], summary["run_alive"]) == (
        "summary", "hangup", 129, True)
    assert "hung up (SIGHUP)" in summary["message"] and "Reattach with: gpuops logs -f" in summary["message"]
    assert junit_errors(report) == {"ct201": ("error", "hangup")}
    assert fleet.alive(201)
    assert fleet.run("stop", "ct201").code == 0


def test_stop_on_exit_does_not_go_with_detach(fleet: Fleet) -> None:
    result = fleet.run("launch", "ct201", extra=("--detach", "--stop-on-exit"))
    assert result.code == 2 and "--stop-on-exit does not go with --detach" in result.err, result
