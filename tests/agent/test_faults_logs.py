"""Logs that are rewritten under the watchdog (issue 19, item 9), on the real-sshd bench: truncated and
rewritten past their old size in one burst, renamed (`mv log log.1`) while the job writes on, deleted.
The FX race is still stopped, and a run that logs on is never taken for stalled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bench import FakeProxmox, SshServer, wait_until
from bench.watchdog import events, wait_watching
from test_reliability import FX_SAMPLE
from test_watch import Ct, make_ct, trainer
from test_watchdog import go_file, run_stopped

STALL = 4  # seconds: a run that goes on logging every 0.05 s must never reach it


@pytest.fixture
def ct(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Ct:
    return make_ct(sshd, fake_proxmox, tmp_path)


def stopped_for_the_fx_race(ct: Ct) -> None:
    wait_until(lambda: run_stopped(ct), timeout=60, message="the watchdog to stop the run")
    record = ct.abort_record()
    assert (record["reason"], record["rule"], record["by"]) == ("match", "fx-tracing-race", "watchdog"), record


def test_a_log_truncated_and_rewritten_past_its_size_is_read_again_from_byte_0(ct: Ct) -> None:
    ct.launch_detached(trainer("steps", "--steps", "100000"))
    run = ct.run_dir()
    wait_watching(run)
    log = run / "log"
    wait_until(lambda: log.stat().st_size > 2000, timeout=30, message="the log to grow")
    fx = FX_SAMPLE.read_bytes()
    burst = fx + b"x" * (log.stat().st_size + 4096 - len(fx)) + b"\n"
    fd = os.open(log, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, burst)  # at byte 0, past the old size: the size alone says nothing happened
    finally:
        os.close(fd)
    stopped_for_the_fx_race(ct)
    assert any(e["event"] == "log_reset" for e in events(run))


@pytest.mark.parametrize("how", ["renamed", "deleted"])
def test_a_log_renamed_or_deleted_is_read_on_while_the_job_writes_it(ct: Ct, how: str) -> None:
    go, opt = go_file(ct)
    ct.launch_detached(trainer("fx-thread", opt), stall=STALL)
    run = ct.run_dir()
    wait_watching(run)
    log = run / "log"
    wait_until(lambda: log.stat().st_size > 500, timeout=30, message="the log to grow")
    moved = run / "log.1"
    with open(log, "rb") as keep:  # what the job writes on, whatever its name
        if how == "renamed":
            log.rename(moved)
        else:
            log.unlink()
        size = os.fstat(keep.fileno()).st_size
        # The job logs on for longer than the stall timeout: no stall may be declared.
        wait_until(lambda: os.fstat(keep.fileno()).st_size > size + 40 * 20 * STALL, timeout=60,
                   message="the job to log on past the stall timeout")
    assert not (run / "abort.json").exists(), ct.abort_record()
    go.touch()  # the race lands in the renamed / deleted file
    stopped_for_the_fx_race(ct)
