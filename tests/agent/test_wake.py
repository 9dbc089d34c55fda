"""The watchdog sleeps until something happens (issue 21), over real sshd + pct into CT 200, real tmux.

What a user notices: a detached run's FX race is stopped by the watchdog whether it waits on inotify
or (inotify turned off, as on a kernel without it) polls, and status says which; an idle run costs
its target no tmux process twice a second and no nvidia-smi every 10 s (a tmux and an nvidia-smi on
the container's PATH count their calls); the training's end is still seen, and only a confirmed end
ends the run.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml
from bench import BENCH_PATH, wait_until
from bench.watchdog import events, heartbeat, wait_watching
from test_watch import GPUS, SESSION, Ct, trainer
from test_watchdog import go_file, run_stopped


def counting_tmux(ct: Ct) -> Path:
    """A tmux first on the container's PATH that writes its subcommand to a file, then runs the real one."""
    bindir = ct.tmp / "counting-bin"
    bindir.mkdir(exist_ok=True)
    calls = ct.tmp / "tmux-calls"
    calls.write_text("")
    shim = bindir / "tmux"
    shim.write_text(f"#!/bin/bash\nprintf '%s\\n' \"$1\" >> {shlex.quote(str(calls))}\n"
                    f"exec {shlex.quote(shutil.which('tmux') or 'tmux')} \"$@\"\n")
    shim.chmod(0o755)
    ct.fake.set_env(200, PATH=f"{bindir}:{BENCH_PATH}")
    return calls


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "poll"])
def test_a_detached_fx_race_is_stopped_whether_the_watchdog_waits_on_inotify_or_polls(ct: Ct, inotify: bool) -> None:
    if not inotify:
        ct.fake.set_env(200, GPUOPS_AGENT_NO_INOTIFY="1")
    go, opt = go_file(ct)
    ct.launch_detached(trainer("fx-thread", opt))
    d = ct.run_dir()
    wait_watching(d)
    ct.wait_training()
    wait = heartbeat(d)["wait"]
    assert wait == "inotify" if inotify else wait == "poll (inotify turned off)", wait
    status = ct.gpuops("status")
    assert ("polling the log: inotify turned off" in status.err + status.text) is not inotify, status
    go.touch()
    wait_until(lambda: run_stopped(ct), timeout=30, message="the watchdog to stop the run")
    record = ct.abort_record()
    assert (record["reason"], record["rule"], record["by"]) == ("match", "fx-tracing-race", "watchdog")
    # After the end, status still says how the watchdog waited (not "poll ()": it stopped waiting).
    wait_until(lambda: heartbeat(d).get("state") == "done", timeout=30,
               message=lambda: f"the watchdog to record the end: {heartbeat(d)}")
    assert heartbeat(d)["wait"] == wait


def test_an_idle_run_spawns_no_tmux_check_and_no_nvidia_smi_and_its_end_is_still_seen(ct: Ct) -> None:
    calls = counting_tmux(ct)
    smi_calls = ct.tmp / "smi-calls"
    ct.fake.set_env(200, GPUOPS_FAKE_SMI_CALLS=str(smi_calls))
    # One line a second, both GPUs sampled every 0.5 s, the compute processes counted every 2.5 s.
    command = " ".join(["fake-train", "--mode", "steps", "--steps", "100000", "--gpus", ",".join(map(str, GPUS)),
                        "--interval", "1"])
    path = ct.playbook(command)
    data = yaml.safe_load(path.read_text())
    data["watch"]["sample_interval"] = 0.5
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = ct.gpuops("launch", "--detach")
    assert result.code == 0, result
    d = ct.run_dir()
    wait_watching(d)
    ct.wait_training()
    wait_until(lambda: any("-lms" in c and "compute-apps" in c for c in lines(smi_calls)), timeout=30,
               message="the watchdog's compute-apps loop")
    wait_until(lambda: '"p":' in (d / "samples.jsonl").read_text(), timeout=30, message="a sample with process counts")
    # The window: six heartbeats of the watchdog, while the run logs and is sampled.
    tmux_before, smi_before = len(lines(calls)), len(lines(smi_calls))
    beat0 = float(heartbeat(d)["ts"])
    wait_until(lambda: float(heartbeat(d).get("ts") or 0) >= beat0 + 6, timeout=60, message="six seconds of heartbeats")
    window = lines(calls)[tmux_before:]
    assert window == [], window  # the pane's pid and terminal say it lives; it was 2 has-session a second
    assert lines(smi_calls)[smi_before:] == []  # the two loops run on; no one-shot query every 10 s
    counted = [s for s in (d / "samples.jsonl").read_text().splitlines() if '"p":' in s]
    assert counted and all('"p":{"5":1,"6":1}' in s for s in counted[1:]), counted[-3:]
    # The training's pane process killed: no exit record, its session gone. The watchdog sees it end.
    pane = int(ct.fake.tmux(200, "display-message", "-p", "-t", f"={SESSION}:", "#{pane_pid}").stdout.strip())
    os.kill(pane, signal.SIGKILL)
    wait_until(lambda: heartbeat(d).get("state") == "done", timeout=30, message="the watchdog to record the end")
    assert any(e["event"] == "session_gone" for e in events(d))
    wait_until(lambda: not ct.run_processes(), timeout=30, message="the run's processes to be reaped")


def test_waits_end_at_once_when_a_record_appears_and_a_poll_is_all_there_is_without_inotify(tmp_path: Path,
                                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait itself: a file change ends it early (inotify), the timeout ends it otherwise; the fallback
    waits POLL at most. Figures are printed, not asserted against a clock."""
    from gpuops.agent.system import wake

    (tmp_path / "log").write_bytes(b"")
    w = wake.Waker(str(tmp_path), ["log"], quiet=["watchdog.json"])
    assert w.mode == "inotify"
    assert w.wait(0.05) == [] and w.timed_out
    (tmp_path / "log").write_bytes(b"line\n")
    t0 = time.monotonic()
    assert w.wait(30) == [] and not w.timed_out  # the growth ended it, not the 30 s
    print("woke after %.2f ms" % ((time.monotonic() - t0) * 1000))
    (tmp_path / "watchdog.json").write_text("{}")  # its own record wakes nobody
    assert w.wait(0.05) == [] and w.timed_out
    os.rename(tmp_path / "log", tmp_path / "log.1")  # replaced: the new file is watched
    assert w.wait(30) == [] and not w.timed_out
    (tmp_path / "log").write_bytes(b"")
    assert w.wait(30) == [] and not w.timed_out
    while w.wait(0.05) or not w.timed_out:
        pass
    with open(tmp_path / "log", "ab") as fh:
        fh.write(b"more\n")
    assert w.wait(30) == [] and not w.timed_out
    w.close()
    monkeypatch.setenv(wake.NO_INOTIFY_ENV, "1")
    p = wake.Waker(str(tmp_path), ["log"])
    assert p.mode == "poll (inotify turned off)"
    assert p.wait(30) == [] and p.timed_out is False  # a poll returns after POLL, whatever happened


def test_a_streaming_log_wakes_the_waiter_once_per_gather_window_not_once_per_write(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # At 20 MB/s the watchdog was woken by every write and read a line at a time (20% of a core). Real
    # writes and real inotify; the waiter's clock is the test's, so what it sleeps is exact.
    from gpuops.agent.system import wake

    log = tmp_path / "log"
    log.write_text("")
    waker = wake.Waker(str(tmp_path), ["log"])
    if waker.fd is None:
        pytest.skip(f"no inotify here: {waker.mode}")
    clock = [1000.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(wake.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(wake.time, "sleep", sleep)
    try:
        with open(log, "a") as fh:
            def change_after(seconds: float) -> None:
                clock[0] += seconds
                fh.write("step\n")
                fh.flush()
                assert waker.wait(5.0) == [] and not waker.timed_out  # woken by the log

            change_after(60.0)
            assert slept == []  # a quiet log's first line is reported at once
            change_after(0.001)  # the next write 1 ms later: held until GATHER after the last wake
            assert slept == [pytest.approx(wake.GATHER - 0.001)]
            change_after(0.0)
            assert slept[-1] == pytest.approx(wake.GATHER)
            change_after(wake.GATHER + 0.5)  # quiet again for longer than a window: at once
            assert len(slept) == 2
    finally:
        waker.close()


def test_a_rotation_that_inotify_cannot_see_polls_for_a_while_not_for_good(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 29.10: `mv log log.1` with the job writing on into log.1 sends no event for the name `log`;
    # three timed-out waits that found growth made the watchdog poll every 20 ms for the rest of the run
    from gpuops.agent.system import wake

    (tmp_path / "log").write_bytes(b"")
    w = wake.Waker(str(tmp_path), ["log"])
    for _ in range(wake.MISSES_TO_POLL):
        assert w.wait(0.01) == [] and w.timed_out
        w.missed()  # the caller found the renamed log grown
    assert w.mode == "poll (inotify sent no events)"
    monkeypatch.setattr(wake.time, "monotonic", lambda: w.retry_at + 1.0)  # RETRY_AFTER later
    w.wait(0.0)
    assert w.mode == "inotify"
    w.close()
