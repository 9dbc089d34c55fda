"""The agent under faults it will meet (issue 19, items 1-4), injected on the real-sshd bench: a tmux
that fails, a full disk, the watchdog killed with SIGTERM, the watchdog frozen with SIGSTOP.

Each test asserts what a user would notice: the healthy run goes on (session, processes), and an FX
race printed after the fault is still stopped by the watchdog, nobody attached.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from bench import procs, wait_until
from bench.faults import calls, can_mount, container_path, full_disk, tmpfs, tmux_wrapper
from bench.watchdog import events, heartbeat, kill_watchdog, wait_watching
from test_watch import Ct, trainer
from test_watchdog import go_file, run_stopped


def stopped_by_the_watchdog(ct: Ct) -> None:
    """The run is stopped by the watchdog for the FX race: session, processes and GPU memory gone."""
    wait_until(lambda: run_stopped(ct), timeout=60, message="the watchdog to stop the run")
    record = ct.abort_record()
    assert (record["rule"], record["by"]) == ("fx-tracing-race", "watchdog"), record


# -- 1. a tmux error is no end of the session ---------------------------------------------------------
@pytest.mark.parametrize("said", ["no server running on /tmp/tmux-0/default",  # its socket deleted
                                  "protocol version mismatch (client 8, server 7)"])
def test_a_failing_tmux_never_ends_a_healthy_run(ct: Ct, said: str) -> None:
    flag, count = ct.tmp / "tmux-broken", ct.tmp / "tmux-calls"
    tmux_wrapper(ct.tmp / "bin", flag, count, stderr=said, commands=("has-session", "display-message"))
    container_path(ct.fake, ct.tmp / "bin")
    go, opt = go_file(ct)
    ct.launch_detached(trainer("fx-thread", opt))
    wait_watching(ct.run_dir())
    ct.wait_training()
    trainers = ct.run_processes()
    flag.touch()
    # A watchdog that knows the pane asks tmux nothing (the training's end comes from its pid, its
    # terminal and its exit record). One started again must ask: it cannot learn the pane, so it
    # checks the session twice a second, and every answer is the error.
    kill_watchdog(ct.run_dir())
    wait_until(lambda: calls(count) >= 2, timeout=90, message="the new watchdog to meet the failing tmux twice")
    flag.unlink()
    assert ct.session_alive() and all(procs.is_alive(pid) for pid in trainers), "a tmux error killed the run"
    assert not any(e["event"] in ("session_gone", "done") for e in events(ct.run_dir()))
    go.touch()
    stopped_by_the_watchdog(ct)


def test_tmux_state_tells_a_gone_session_from_a_failing_tmux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuops.agent.system import tmux

    flag, count = tmp_path / "flag", tmp_path / "count"
    flag.touch()
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))
    monkeypatch.delenv("TMUX", raising=False)
    for said, state in [("can't find session: =train", tmux.GONE),
                        ("protocol version mismatch (client 8, server 7)", tmux.UNSURE),
                        ("fork failed: Resource temporarily unavailable", tmux.UNSURE),
                        ("no server running on /tmp/tmux-0/default", tmux.UNSURE)]:
        tmux_wrapper(tmp_path / "bin", flag, count, stderr=said)
        assert tmux.state("train") == state, said
    # No server at all (the session killed by hand took it down): gone, even with processes of the run left.
    assert tmux.gone("train", "fault-run-1")
    # A server that runs on with its socket deleted: not gone.
    flag.unlink()
    subprocess.run(["tmux", "new-session", "-d", "-s", "train", "sleep 60"], check=True)
    try:
        os.unlink(tmux.socket_path())
        flag.touch()
        assert tmux.server_listening() is True
        assert not tmux.gone("train", "fault-run-1")
    finally:
        flag.unlink()
        for pid in procs.find(lambda env: env.get(b"TMUX_TMPDIR") == str(tmp_path).encode()):
            os.kill(pid, signal.SIGKILL)


# -- 2. a full disk for a while ------------------------------------------------------------------------
def quiet_fx_job(ct: Ct, go: Path) -> str:
    """A job that writes nothing until `go` exists (a full disk would fail its writes), then the FX race."""
    from test_reliability import FX_SAMPLE

    return (f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done; cat {shlex.quote(str(FX_SAMPLE))}; "
            "while true; do echo 'step eager'; sleep 0.1; done")


@pytest.mark.skipif(not can_mount(), reason="needs root and mount(8) for a tmpfs")
def test_a_full_disk_for_a_while_leaves_the_run_protected(ct: Ct) -> None:
    state = ct.fake.home(200) / ".gpuops"
    with tmpfs(state, "24m"):
        go = ct.tmp / "go"
        ct.launch_detached(quiet_fx_job(ct, go))
        run = ct.run_dir()
        wait_watching(run)
        with full_disk(state):
            last = heartbeat(run).get("ts") or time.time()
            wait_until(lambda: time.time() - last > 3, timeout=30, message="3 s of full disk")
        assert ct.session_alive()
        go.touch()
        wait_until(lambda: (run / "abort-done.json").exists(), timeout=60, message="the watchdog to stop the run")
        assert ct.abort_record()["by"] == "watchdog" and ct.abort_record()["rule"] == "fx-tracing-race"
        wait_until(lambda: not ct.session_alive(), timeout=30, message="the session to end")
        assert any(e["event"] == "write_failed" for e in events(run))


# -- 3. `kill <watchdog pid>` -------------------------------------------------------------------------
def test_a_watchdog_killed_with_sigterm_is_started_again(ct: Ct) -> None:
    go, opt = go_file(ct)
    ct.launch_detached(trainer("fx-thread", opt))
    first = wait_watching(ct.run_dir())
    os.kill(first, signal.SIGTERM)
    second = wait_until(lambda: (pid := wait_watching(ct.run_dir(), timeout=30)) != first and pid, timeout=30,
                        message="the watchdog to be started again")
    assert second != first
    go.touch()
    stopped_by_the_watchdog(ct)


# -- 4. a frozen watchdog -----------------------------------------------------------------------------
def test_a_frozen_watchdog_is_killed_and_started_again(ct: Ct) -> None:
    go, opt = go_file(ct)
    ct.launch_detached(trainer("fx-thread", opt))
    first = wait_watching(ct.run_dir())
    os.kill(first, signal.SIGSTOP)
    try:
        wait_until(lambda: any(e["event"] == "watchdog_restarted" and e.get("frozen") for e in events(ct.run_dir())),
                   timeout=60, message="the supervisor to notice the frozen watchdog")
        assert not procs.is_alive(first)
        go.touch()
        stopped_by_the_watchdog(ct)
    finally:
        if procs.is_alive(first):
            os.kill(first, signal.SIGKILL)


# -- the run's records deleted under it ---------------------------------------------------------------
def test_a_deleted_run_directory_ends_its_supervisor_and_watchdog_without_a_crash_loop(ct: Ct) -> None:
    ct.launch_detached(trainer("steps", "--steps", "100000"))
    d = ct.run_dir()
    watchdog = wait_watching(d)
    supervisor = int((d / "supervisor.pid").read_text())
    subprocess.run(["rm", "-rf", str(d)], check=True)
    # Nothing is left to watch or write: both end (a crash loop of the watchdog lasted about 2 minutes).
    wait_until(lambda: not procs.is_alive(supervisor) and not procs.is_alive(watchdog), timeout=30,
               message="the supervisor and the watchdog of the deleted run to end")
    mine = f"watchdog {d.name}".encode()  # none started again meanwhile
    assert not [pid for pid in procs.find(lambda env: True) if mine in _cmdline(pid)]
    assert ct.gpuops("stop").code == 0  # the training in its session is still stopped by name
    assert not ct.session_alive()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""
