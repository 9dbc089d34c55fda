"""The watchdog on the target guards a run with nobody attached: over real sshd + pct into CT 200, real tmux.

What a user notices is asserted: the run is stopped (session gone, processes gone, GPU memory back to
0) within seconds of the failure with no client connected; `logs -f` afterwards exits with the run's
real code naming the rule; abort.json says who stopped it; the watchdog killed mid-run is back and
still catches the failure, reporting each match once; a run is signalled once whoever races to stop it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from pathlib import Path

import pytest
from bench import procs, wait_until
from bench.watchdog import events, heartbeat, kill_watchdog, pids, wait_watching
from test_watch import FX_LINE, SESSION, Ct, trainer


def run_stopped(ct: Ct) -> bool:
    return not ct.session_alive() and not ct.run_processes() and not any(ct.gpu_memory().values())


def go_file(ct: Ct) -> tuple[Path, str]:
    """A file whose creation makes fake-train fail (--go), and the option that says so."""
    path = ct.tmp / "go"
    return path, f"--go {shlex.quote(str(path))}"


def test_a_detached_run_that_hits_the_fx_race_is_stopped_with_nobody_attached(ct: Ct) -> None:
    go, opt = go_file(ct)
    run_id = ct.launch_detached(trainer("fx-thread", opt))
    wait_watching(ct.run_dir())
    ct.wait_training()
    go.touch()  # the race happens now; no gpuops client is connected
    started = time.monotonic()
    wait_until(lambda: run_stopped(ct), timeout=30, message="the watchdog to stop the run")
    took = time.monotonic() - started
    record = ct.abort_record()
    assert (record["reason"], record["rule"], record["by"]) == ("match", "fx-tracing-race", "watchdog")
    assert FX_LINE in record["excerpt"]
    done = json.loads((ct.run_dir() / "abort-done.json").read_text())
    assert done["survivors"] == [] and [g["memory_used_mib"] for g in done["gpus"]] == [0, 0]
    # Afterwards, from any machine: the log to its end and the run's real outcome.
    after = ct.gpuops("logs", "-f")
    assert after.code == 7, after
    assert "rule 'fx-tracing-race' matched (stopped by the watchdog)" in after.err, after
    assert FX_LINE.encode() in after.out
    status = ct.gpuops("status", "--json")
    (session,) = [s for s in status.events()[0]["sessions"] if s["session"] == SESSION]
    assert (session["run"]["state"], session["run"]["stopped_by"]) == ("aborted", "watchdog")
    assert session["run"]["id"] == run_id
    assert took < 30  # the latency figures are in BENCHMARKS.md (benchmarks/run.py)


def test_the_launcher_killed_mid_run_leaves_the_run_protected(ct: Ct) -> None:
    go, opt = go_file(ct)
    ct.playbook(trainer("fx-caught", opt))
    launcher = ct.start("launch")
    launcher.wait_for(lambda: "step 3/" in launcher.out, "training to stream")
    launcher.signal(signal.SIGKILL)  # the laptop's lid closes: no Ctrl-C, no goodbye
    launcher.finish()
    go.touch()
    wait_until(lambda: run_stopped(ct), timeout=30, message="the watchdog to stop the run")
    assert ct.abort_record()["by"] == "watchdog"
    assert ct.gpuops("logs", "-f").code == 7


def test_a_killed_watchdog_comes_back_resumes_and_reports_each_match_once(ct: Ct) -> None:
    go, opt = go_file(ct)
    # A warn rule that matches every step line: resumed from its checkpoint, the watchdog re-reads
    # some lines, and must not report them twice.
    rules = [{"name": "every-step", "pattern": r"^step \d+/", "action": "warn"}]
    ct.launch_detached(trainer("fx-thread", opt, "--interval", "0.02"), rules=rules)
    first = wait_watching(ct.run_dir())
    killed = kill_watchdog(ct.run_dir())
    assert killed == first
    started = time.monotonic()
    second = wait_watching(ct.run_dir(), timeout=30)
    assert second != first
    assert time.monotonic() - started < 5  # back within 5 s (the supervisor, not a client)
    kill_watchdog(ct.run_dir())
    wait_watching(ct.run_dir(), timeout=30)
    go.touch()
    wait_until(lambda: run_stopped(ct), timeout=30, message="the restarted watchdog to stop the run")
    evs = events(ct.run_dir())
    matches = [(e["rule"], e["offset"]) for e in evs if e["event"] == "match"]
    assert len(matches) == len(set(matches)), "a match was reported twice"
    assert [r for r, _ in matches].count("fx-tracing-race") == 1
    assert [e["event"] for e in evs].count("watchdog_restarted") == 2
    assert ct.abort_record()["by"] == "watchdog"
    assert heartbeat(ct.run_dir())["restarts"] == 2


def test_torch_2_11_eager_fallback_thread_race_aborts_and_the_unfused_warning_is_reported(ct: Ct) -> None:
    ct.launch_detached(trainer("sample", "--sample", "fx_patcher_race", "--then", "run", "--slow-interval", "0.2"))
    wait_until(lambda: run_stopped(ct), timeout=30, message="the watchdog to stop the run")
    evs = events(ct.run_dir())
    assert [(e["rule"], e["action"]) for e in evs if e["event"] == "match"] == [
        ("flex-attention-unfused", "warn"), ("fx-patcher-race", "abort")]
    assert ct.abort_record()["rule"] == "fx-patcher-race"
    after = ct.gpuops("logs", "-f", "--json")
    assert after.code == 7 and after.events()[-1]["rule"] == "fx-patcher-race"


def _container_path(ct: Ct, bindir: Path) -> None:
    """The container's PATH: `bindir` first, then the bench's."""
    from bench import BENCH_PATH

    ct.fake.set_env(200, PATH=f"{bindir}:{BENCH_PATH}")


def test_a_watchdog_that_cannot_start_fails_the_launch_before_training(ct: Ct) -> None:
    # Fault injection: the container's python3 runs everything but the watchdog's supervisor.
    import sys

    bindir = ct.tmp / "broken-python"
    bindir.mkdir()
    shim = bindir / "python3"
    shim.write_text("#!/bin/bash\n"
                    'for a in "$@"; do [ "$a" = supervise ] && { echo "ImportError: injected fault" >&2; exit 1; }; done\n'
                    f'exec -a "$0" {shlex.quote(sys.executable)} "$@"\n')  # sys.executable: this shim
    shim.chmod(0o755)
    _container_path(ct, bindir)
    marker = ct.tmp / "trained"
    ct.playbook(f"touch {shlex.quote(str(marker))}; {trainer('steps')}")
    result = ct.gpuops("launch")
    assert result.code == 4, result
    assert "the watchdog could not start, so training was not started: ImportError: injected fault" in result.err, result
    assert not marker.exists() and not ct.session_alive()
    assert json.loads((ct.run_dir() / "meta.json").read_text())["phase"] == "start-failed"
    status = ct.gpuops("status", "--json")
    (session,) = [s for s in status.events()[0]["sessions"] if s["session"] == SESSION]
    assert session["run"]["state"] == "not-started"  # not a lost run


def test_a_target_without_python3_fails_preflight_with_exit_4(ct: Ct) -> None:
    # Every tool of the container but python3 (no GPUs are checked: nvidia-smi's stand-in is Python).
    bindir = ct.tmp / "no-python"
    bindir.mkdir()
    for folder in ("/usr/bin", "/bin"):
        for name in os.listdir(folder):
            if not name.startswith("python") and not (bindir / name).exists():
                (bindir / name).symlink_to(os.path.join(folder, name))
    ct.fake.set_env(200, PATH=str(bindir))
    ct.playbook(trainer("steps"), gpus=())
    result = ct.gpuops("launch")
    assert result.code == 4, result
    assert "python3 is not installed on the target" in result.err, result
    assert not ct.session_alive() and not (ct.fake.home(200) / ".gpuops" / "runs").exists()


def test_a_target_whose_python3_is_too_old_fails_preflight_with_exit_4(ct: Ct) -> None:
    import glob

    old = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.6.*/bin/python3.6")))
    if not old:
        pytest.skip("no Python 3.6 here to stand for a target's old python3")
    bindir = ct.tmp / "old-python"
    bindir.mkdir()
    (bindir / "python3").symlink_to(old[0])
    _container_path(ct, bindir)
    ct.playbook(trainer("steps"), gpus=())
    result = ct.gpuops("launch")
    assert result.code == 4, result
    assert "the target's python3 is 3.6" in result.err and "3.8 or newer" in result.err, result


def test_a_run_folder_that_cannot_be_made_fails_the_launch_with_exit_4(ct: Ct) -> None:
    # ~/.gpuops/runs is a file (as root, permissions would not stop gpuops; a read-only home acts the same).
    runs = ct.fake.home(200) / ".gpuops" / "runs"
    runs.parent.mkdir(parents=True)
    runs.write_text("not a folder\n")
    ct.playbook(trainer("steps"))
    result = ct.gpuops("launch")
    assert result.code == 4, result
    assert "cannot create gpuops' folders under ~/.gpuops on the target: mkdir: cannot create directory" in result.err, result
    assert not ct.session_alive()


def test_stop_and_the_watchdog_racing_signal_the_run_once(ct: Ct) -> None:
    go, opt = go_file(ct)
    ct.launch_detached(trainer("ignore-int", opt), grace=3)  # SIGINT ignored: only the kill after the grace ends it
    wait_watching(ct.run_dir())
    ct.wait_training()
    stopper = ct.start("stop")
    stopper.wait_for(lambda: (ct.run_dir() / "abort.json").exists(), "stop to claim the abort")
    go.touch()
    result = stopper.finish()
    assert result.code == 0, result
    record = ct.abort_record()
    assert record["by"] == "stop"
    evs = events(ct.run_dir())
    assert not any(e["event"] == "abort_start" for e in evs)  # the watchdog saw the claim and did not signal
    assert any(e["event"] == "stopped_elsewhere" and e["stopped_by"] == "stop" for e in evs)
    ct.assert_run_gone()
    assert ct.gpuops("logs", "-f").code == 6  # stopped by `gpuops stop`: training did not succeed


def test_the_watchdog_carries_no_run_marker_and_ends_with_the_run(ct: Ct) -> None:
    run_id = ct.launch_detached(trainer("steps", "--steps", "30"))
    pid = wait_watching(ct.run_dir())
    assert b"GPUOPS_RUN_ID" not in Path(f"/proc/{pid}/environ").read_bytes()
    assert pid not in ct.run_processes()
    wait_until(lambda: not pids(run_id) and not pids(run_id, "supervise"), timeout=60,
               message="the watchdog and its supervisor to end with the run")
    assert heartbeat(ct.run_dir())["state"] == "done"
    assert events(ct.run_dir())[-1]["event"] == "done"
    assert ct.gpuops("logs", "-f").code == 0


def test_status_says_whether_the_watchdog_is_alive_and_who_stopped_the_run(ct: Ct) -> None:
    from bench.watchdog import remove_watchdog

    go, opt = go_file(ct)
    ct.launch_detached(trainer("fx-thread", opt))
    wait_watching(ct.run_dir())
    text = ct.gpuops("status").text
    assert re.search(r"run \S+ running; log grew \d+s ago; watchdog alive \(heartbeat \d+\.\d+s ago\)", text), text
    remove_watchdog(ct.run_dir())
    text = ct.gpuops("status").text
    assert "WATCHDOG GONE" in text and "nothing guards the run" in text, text
    (session,) = [s for s in ct.gpuops("status", "--json").events()[0]["sessions"] if s["session"] == SESSION]
    assert session["run"]["watchdog"]["alive"] is False
    follow = ct.start("logs", "-f", "--json")  # a following client takes over
    follow.wait_for(lambda: '"event": "watchdog_stale"' in follow.out, "the client to take over")
    go.touch()
    result = follow.finish()
    assert result.code == 7, result
    assert ct.abort_record()["by"] == "client"
    assert "stopped by a following client" in ct.gpuops("status").text


def test_a_killed_watchdog_leaves_no_gpu_sampler_behind(ct: Ct) -> None:
    # The watchdog samples through one nvidia-smi loop; SIGKILLed, it must not leave that loop running.
    # A 30 s interval: the loop would only notice its reader is gone (SIGPIPE) at its next write.
    import yaml

    pb = ct.playbook(trainer("steps", "--steps", "100000"))
    data = yaml.safe_load(pb.read_text())
    data["watch"].update(sample_interval=30, gpu_memory=False, compile_after_warmup=False)
    pb.write_text(yaml.safe_dump(data))
    assert ct.gpuops("launch", "--detach").code == 0
    pid = wait_watching(ct.run_dir())

    def samplers() -> list[int]:
        mine = str(ct.fake.gpu_dir(200)).encode()  # this bench's container, not another test's
        return [p for p in procs.find(lambda env: env.get(b"GPUOPS_FAKE_GPUS") == mine)
                if b"-lms" in Path(f"/proc/{p}/cmdline").read_bytes()]

    # Two loops: the samples, and the compute processes (issue 21: a loop, not a one-shot every 10 s).
    loops = wait_until(lambda: (lambda found: found if len(found) == 2 else None)(samplers()), timeout=30,
                       message="the watchdog's two nvidia-smi loops")
    kill_watchdog(ct.run_dir())
    wait_until(lambda: not any(procs.is_alive(p) for p in loops), timeout=10,
               message="the dead watchdog's nvidia-smi loops to end")
    assert wait_watching(ct.run_dir()) != pid
    assert ct.gpuops("stop").code == 0


def test_a_watchdog_killed_in_its_own_aborts_grace_is_finished_by_the_next_without_a_second_signal(ct: Ct) -> None:
    # A trainer that catches Ctrl-C (to save a checkpoint) counts each one; the watchdog dies in the grace.
    count, go, script = ct.tmp / "sigints", ct.tmp / "go", ct.tmp / "trainer.sh"
    script.write_text("trap 'echo INT >>\"$COUNT\"' INT\n"
                      'while [ ! -e "$GO" ]; do echo step; sleep 0.1; done\n'
                      "echo boom-now\nwhile true; do echo saving; sleep 0.1; done\n")
    job = f"COUNT={shlex.quote(str(count))} GO={shlex.quote(str(go))} bash {shlex.quote(str(script))}"
    rules = [{"name": "boom", "pattern": "boom-now", "action": "abort"}]
    ct.launch_detached(job, rules=rules, grace=6)
    wait_watching(ct.run_dir())
    go.touch()
    wait_until(lambda: (ct.run_dir() / "abort-signalled").exists(), timeout=30, message="the watchdog to send its Ctrl-C")
    first = heartbeat(ct.run_dir())["pid"]
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: (ct.run_dir() / "abort-done.json").exists(), timeout=60, message="the next watchdog to finish the abort")
    assert not ct.session_alive()
    assert count.read_text().splitlines() == ["INT"]  # one Ctrl-C, however many watchdogs
    evs = events(ct.run_dir())
    assert [e["event"] for e in evs].count("abort_start") == 1
    assert any(e["event"] == "abort_completed" for e in evs)
    assert ct.abort_record()["rule"] == "boom"
