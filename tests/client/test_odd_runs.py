"""Odd runs end with a clear outcome and the documented exit code, never a hang.

`gpuops launch` over real sshd + pct into CT 200 with real tmux: a command that exits at once,
a workdir that does not exist, a command that is not found, a log deleted under the run (read on), a tmux
session killed by hand, a container stopped mid-run, a disk that fills up (the log stops growing
while the trainer stays alive). Each test asserts what the user sees: the exit code, the words on
stderr (or the JSON summary), and that nothing of the run is left on the target.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from bench import wait_until
from bench.cli import CtCli

SESSION = "odd"
GPUS = (5, 6)


class Ct(CtCli):
    """CT 200 reached over the bench's sshd, with this file's playbook."""

    def playbook_for(self, command: str, *, stall: float = 0, workdir: str | None = None, warmup: dict | None = None) -> Path:
        data: dict[str, Any] = {
            "name": "odd-runs",
            "preflight": {"gpus": list(GPUS)},
            "launch": {"session": SESSION, "command": command},
            "watch": {"stall_timeout": stall},
            "abort": {"grace": 3},
        }
        if workdir is not None:
            data["workdir"] = workdir
        if warmup is not None:
            data["warmup"] = warmup
        return self.write(data)

    def assert_run_gone(self) -> None:
        assert not self.session_alive(), "the tmux session is still alive"
        assert self.run_processes() == [], "processes of the run are left"
        assert self.gpu_memory(GPUS) == [0] * len(GPUS), "the run's GPU memory is still held"


def trainer(mode: str, *extra: str) -> str:
    return " ".join(["fake-train", "--mode", mode, "--gpus", ",".join(map(str, GPUS)), "--interval", "0.05", *extra])


# -- the command ends at once -------------------------------------------------------------------
def test_a_command_that_exits_0_at_once_succeeds(ct: Ct) -> None:
    ct.playbook_for(trainer("quit"))
    result = ct.gpuops("launch")
    assert result.code == 0, result
    assert re.search(r"gpuops: run \S+ finished with exit code 0", result.err), result
    assert (ct.run_dir() / "exit_code").read_text() == "0\n"
    ct.assert_run_gone()


def test_a_command_that_exits_3_at_once_fails_with_6(ct: Ct) -> None:
    # `exit 3` ends before tmux has even returned: the run still counts as started, then failed.
    ct.playbook_for("exit 3")
    result = ct.gpuops("launch", "--json")
    assert result.code == 6, result
    summary = result.events()[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"]) == ("summary", "failed", 6), result
    assert summary["command_exit_code"] == 3
    assert "training exited with code 3" in summary["message"]
    assert any(e["event"] == "started" for e in result.events())
    ct.assert_run_gone()


# -- the command never gets going -------------------------------------------------------------------
def test_a_workdir_that_does_not_exist_fails_with_6_and_says_why(ct: Ct) -> None:
    ct.playbook_for(trainer("steps", "--steps", "3"), workdir="/no/such/dir")
    result = ct.gpuops("launch")
    assert result.code == 6, result
    why = "gpuops: cannot cd to the workdir: /no/such/dir: No such file or directory; training not started"
    assert result.text == why + "\n", result  # the log: only gpuops' line, the trainer never ran
    assert f"training exited with code 126; last log line: {why}" in result.err, result
    ct.assert_run_gone()


def test_a_workdir_that_does_not_exist_fails_the_warmup_first(ct: Ct) -> None:
    ct.playbook_for(trainer("steps", "--steps", "3"), workdir="/no/such/dir",
                warmup={"gpus": [5], "command": "fake-warmup --gpu {gpu} --duration 0.2"})
    result = ct.gpuops("launch")
    assert result.code == 5, result
    assert "warmup on GPU 5 exited with code 126" in result.err, result
    assert re.search(r"\| .*cd: /no/such/dir: No such file or directory", result.err), result
    assert "training was not started" in result.err
    assert not ct.session_alive()


def test_a_command_that_is_not_found_fails_with_6_naming_it(ct: Ct) -> None:
    ct.playbook_for("no-such-trainer --epochs 3")
    result = ct.gpuops("launch")
    assert result.code == 6, result
    assert re.search(r"training exited with code 127; last log line: .*no-such-trainer: command not found", result.err), result
    ct.assert_run_gone()


def test_a_log_deleted_under_a_live_run_is_read_on_through_the_open_file(ct: Ct) -> None:
    # The trainer goes on writing into the unlinked file: the watchdog and the follower still hold it
    # open and read on (issue 19, item 9), so the run is not taken for stalled.
    ct.playbook_for(f'rm -f "$GPUOPS_RUN_DIR/log"; exec {trainer("steps", "--steps", "120")}', stall=3)
    result = ct.gpuops("launch")
    assert result.code == 0, result
    assert b"step 120/120" in result.out, result
    assert not (ct.run_dir() / "log").exists()
    ct.assert_run_gone()


# -- the run is taken away mid-way -------------------------------------------------------------------
@pytest.mark.parametrize("hup", ["dies of it", "ignored"])
def test_a_session_killed_by_hand_ends_the_launch_with_6(ct: Ct, hup: str) -> None:
    # A training that ignores SIGHUP lives on when its session is killed (here with the whole tmux
    # server): the end is seen from the pane's terminal hanging up (no tmux is asked meanwhile), what is
    # left of the run is stopped, and the reap's SIGTERM is not taken for the command's own end.
    ignore = "trap '' HUP; exec " if hup == "ignored" else ""
    ct.playbook_for(ignore + trainer("steps", "--steps", "100000"), stall=60)
    launch = ct.start("launch")
    launch.wait_for(lambda: "step 5/" in launch.out, "the log to stream")
    kill = ("kill-session", "-t", f"={SESSION}") if hup != "ignored" else ("kill-server",)
    assert ct.fake.tmux(ct.vmid, *kill).returncode == 0
    result = launch.finish(timeout=60)
    assert result.code == 6, result
    assert ("its tmux session is gone (killed by hand" in result.err
            or (hup != "ignored" and "(SIGHUP: its tmux session was killed)" in result.err)), result
    ct.assert_run_gone()
    if hup == "ignored":  # lost everywhere, as the launch said
        (row,) = ct.gpuops("runs", "--json").events()
        assert (row["outcome"], row["exit_code"]) == ("lost", 6), row
        status = ct.gpuops("status")
        assert "exited 143" not in status.text + status.err and "lost" in status.text + status.err, status


def test_a_container_stopped_mid_run_ends_the_launch_with_6(ct: Ct) -> None:
    ct.playbook_for(trainer("steps", "--steps", "100000"), stall=60)
    launch = ct.start("launch", "--json")
    launch.wait_for(lambda: '"line": "step 5/' in launch.out, "the log to stream")
    assert ct.fake.stop_container(ct.vmid)
    result = launch.finish(timeout=60)  # no reconnect loop: pct says the container is stopped
    assert result.code == 6, result
    summary = result.events()[-1]
    assert (summary["outcome"], summary["exit_code"]) == ("lost", 6), result
    assert "container 200 stopped while it ran" in summary["message"], summary
    assert ct.fake.processes(ct.vmid) == []
    # Started again, the container takes a new launch: the lost run is no obstacle.
    ct.fake.start_container(ct.vmid)
    ct.playbook_for(trainer("steps", "--steps", "3"))
    again = ct.gpuops("launch")
    assert again.code == 0, again
    ct.assert_run_gone()


def test_a_full_disk_that_stops_the_log_is_a_stall_8(ct: Ct) -> None:
    # Writes fail with ENOSPC (/dev/full) while the trainer stays alive: the log stops growing.
    command = (f"{trainer('steps', '--steps', '3')}; "
               "while :; do echo 'step more' >/dev/full 2>/dev/null; sleep 0.05; done")
    ct.playbook_for(command, stall=3)
    launch = ct.start("launch")
    launch.wait_for(lambda: "step 3/" in launch.out, "the last lines before the disk filled")
    wait_until(lambda: ct.run_processes(), message="the trainer, alive after the disk filled")
    result = launch.finish(timeout=60)
    assert result.code == 8, result
    assert re.search(r"gpuops: STALLED \(exit 8\): run \S+ stalled: no log output for [0-9.]+s \(stall_timeout 3s\)",
                     result.err), result
    assert result.text.splitlines()[-1].startswith("step 3/"), result
    ct.assert_run_gone()
