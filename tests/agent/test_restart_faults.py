"""Restarts under faults (issue 29), end to end on the bench: each race window is held open at its named
point (gpuops/agent/system/pause.py, GPUOPS_TEST_PAUSE_AT), not hit by luck.

What a user notices is asserted: a stop in the middle of a restart ends the run for good; the supervisor
leaves a watchdog that waits out a long restart delay alone; another launch cannot take the GPUs of a run
that is between attempts.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, SshServer, procs, wait_until
from bench.faults import can_mount, full_disk, tmpfs
from bench.pauses import flock_waiters, pause_env, reached, release
from bench.watchdog import events, heartbeat
from test_faults_reap import ESCAPE, holders
from test_restart import detached, fails_once, restart_events, run_over, with_restart
from test_watch import Ct, make_ct, trainer


@pytest.fixture
def ct(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Ct:
    return make_ct(sshd, fake_proxmox, tmp_path)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_stop_while_the_watchdog_files_the_ended_attempt_away_ends_the_run_for_good(ct: Ct) -> None:
    # The watchdog is held after it published attempt 2 and before it moved attempt 1's records away: the
    # window where a stop used to lose to attempt 1's abort, be told "already", and let attempt 2 start.
    pauses = pause_env(ct.fake, ct.tmp / "pauses", "restart-published")
    d = detached(ct, trainer("fx-thread"), trainer("steps", "--steps", "300"),
                 {"max": 2, "on": ["fx-tracing-race"], "delay": 1})
    wait_until(lambda: reached(pauses, "restart-published"), timeout=60, message="the watchdog in its restart step")
    stop = ct.start("stop")
    # Held until the stop has decided (it ends) or waits for the step to be over (blocked on its lock).
    wait_until(
        lambda: stop.proc.poll() is not None or any("abort" in _cmdline(pid) for pid in flock_waiters()),
        timeout=60, message="the stop to claim or to wait for the restart step")
    release(pauses, "restart-published")
    stopped = stop.finish()
    assert stopped.code == 0, stopped
    wait_until(lambda: run_over(ct), timeout=60, message="the run to end")
    assert (d / "abort.json").exists() and json.loads((d / "abort.json").read_text())["by"] == "stop", (stopped, events(d))
    assert json.loads((d / "attempts" / "1" / "abort.json").read_text())["by"] == "watchdog"
    assert len(restart_events(d)) == 1 and not (d / "attempts" / "2").exists()
    assert b"step 300/300" not in ((d / "log").read_bytes() if (d / "log").exists() else b"")
    assert "already" not in stopped.err and "stopped" in stopped.err, stopped
    after = ct.gpuops("logs", "-f", "--json")
    assert after.events()[-1]["outcome"] == "stopped", after
    ct.assert_run_gone()


def test_a_restart_delay_longer_than_the_freeze_limit_passes_with_the_same_watchdog(ct: Ct) -> None:
    # 15 s of delay against the supervisor's 8 s without a pulse: the waiting watchdog must still be heard.
    d = detached(ct, trainer("fx-thread"), trainer("steps", "--steps", "2"),
                 {"max": 1, "on": ["fx-tracing-race"], "delay": 15})
    wait_until(lambda: restart_events(d), timeout=60, message="the restart of attempt 1")
    waiting = heartbeat(d)["pid"]
    wait_until(lambda: run_over(ct), timeout=90, message="attempt 2 to finish")
    kinds = [e["event"] for e in events(d)]
    assert "watchdog_restarted" not in kinds and "watchdog_resumed" not in kinds, events(d)
    assert heartbeat(d)["pid"] == waiting and (d / "exit_code").read_text().strip() == "0"
    assert kinds.count("attempt_started") == 1


def test_another_playbooks_launch_on_the_gpus_of_a_run_between_attempts_is_refused(ct: Ct) -> None:
    d = detached(ct, trainer("fx-thread"), trainer("steps", "--steps", "2"),
                 {"max": 1, "on": ["fx-tracing-race"], "delay": 6})
    wait_until(lambda: restart_events(d) and not ct.session_alive(), timeout=60, message="the restart delay")
    other = ct.tmp / "other.yaml"
    data = yaml.safe_load((ct.tmp / "playbook.yaml").read_text())
    data["name"], data["launch"]["session"], data["launch"]["command"] = "other", "other", trainer("steps", "--steps", "2")
    data.pop("restart", None)
    other.write_text(yaml.safe_dump(data, sort_keys=False))
    refused = ct.gpuops("launch", playbook=other)
    assert refused.code == 4, refused
    assert "between attempts" in refused.err and ct.run_id() in refused.err, refused
    wait_until(lambda: run_over(ct), timeout=90, message="attempt 2 to finish")
    assert (d / "exit_code").read_text().strip() == "0"
    assert ct.gpuops("launch", playbook=other).code == 0  # the GPUs are free once the run ended


def test_an_attempt_that_crashed_is_followed_only_on_drained_gpus_and_a_foreign_holder_ends_the_run(ct: Ct) -> None:
    # Attempt 1 leaves a double-forked worker without the run's marker on GPU 6 (20 GB), then crashes (no
    # abort, so no abort drain); meanwhile another user's job, from its own shell, takes GPU 5. Before
    # attempt 2 starts, the run's own escaped worker is killed, and the foreign holder ends the run, named.
    go = ct.tmp / "go"
    first = (f"( setsid {ESCAPE} </dev/null >/dev/null 2>&1 & ); until [ -e {shlex.quote(str(go))} ]; do sleep 0.05; done; "
             f"{trainer('steps', '--steps', '1')}; exit 3")
    d = detached(ct, first, trainer("steps", "--steps", "2"), {"max": 1, "on": ["failed"], "delay": 0})
    gpus = ct.fake.gpus(200)
    wait_until(lambda: gpus.memory_used(6) > 20000, timeout=60, message="the escaped worker to hold GPU 6")
    escaped = [pid for pid in holders(ct) if pid not in ct.run_processes()]
    assert escaped, "the worker carries no marker"
    other = ct.fake.occupy_gpu(200, 5, mib=20000)
    go.touch()
    wait_until(lambda: run_over(ct), timeout=120, message="the run to end before attempt 2")
    failed = [e for e in events(d) if e.get("event") == "restart_failed"]
    assert len(failed) == 1, events(d)
    failed = failed[0]
    assert failed["held_by"] == {"5": [other]}, failed
    assert f"GPU 5 held by pids [{other}]" in failed["message"], failed
    assert not any(procs.is_alive(pid) for pid in escaped) and procs.is_alive(other)
    assert not [e for e in events(d) if e["event"] == "attempt_started"] and not (d / "log").exists()  # never ran
    status = ct.gpuops("status")
    assert "failed to start" in status.text + status.err and f"[{other}]" in status.text + status.err, status


def test_short_restarted_attempts_are_streamed_in_full_twice_in_a_row(ct: Ct) -> None:
    # Attempts 2 and 3 each end well within a second: every line of each must reach the following launch
    # (attempt 1 takes 3 s, so the launch follows from its first line).
    count = shlex.quote(str(ct.tmp / "attempts"))
    command = (f"n=$(cat {count} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {count}; echo attempt $n begins; "
               f"iv=0.05; [ $n -gt 1 ] || iv=1; {trainer('steps', '--steps', '3', '--interval', '$iv')}; "
               f"echo attempt $n ends; [ $n -ge 3 ] || exit 3")
    with_restart(ct, command, {"max": 2, "on": ["failed"], "delay": 0})
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    evs = result.events()
    lines = [e["line"] for e in evs if e["event"] == "log"]
    for n in (1, 2, 3):
        assert f"attempt {n} begins" in lines and f"attempt {n} ends" in lines, [(e["event"], e.get("line") or e.get("what") or e.get("attempt")) for e in evs]
        begins, ends = lines.index(f"attempt {n} begins"), lines.index(f"attempt {n} ends")
        assert [line.split()[1] for line in lines[begins + 1:ends]] == ["1/3", "2/3", "3/3"], lines
    assert [e["attempt"] for e in evs if e["event"] == "restart"] == [2, 3]
    assert evs[-1]["attempts"] == 3, evs[-1]


def test_ctrl_c_of_a_following_launch_during_a_healthy_attempt_2_leaves_it_running(ct: Ct) -> None:
    command = fails_once(ct, trainer("fx-thread"), trainer("steps", "--steps", "600", "--interval", "0.1"))
    with_restart(ct, command, {"max": 1, "on": ["fx-tracing-race"], "delay": 0})
    launch = ct.start("launch")
    d = ct.fake.home(200) / ".gpuops" / "runs"
    launch.wait_for(lambda: "step 3/600" in launch.err + launch.out, "attempt 2 to be followed", timeout=90)
    launch.signal()
    done = launch.finish()
    assert done.code == 130, done
    assert "still alive" in done.err and "Reattach with: gpuops logs -f" in done.err, done
    assert "while stopping" not in done.err and "gpuops stop" not in done.err, done
    assert ct.session_alive() and not (ct.run_dir() / "abort.json").exists(), list(d.iterdir())
    assert ct.gpuops("stop").code == 0


@pytest.mark.skipif(not can_mount(), reason="needs root and mount(8) for a tmpfs")
def test_the_abort_claim_works_with_0_bytes_free_and_leaves_no_claim_files(tmp_path: Path) -> None:
    from gpuops.agent.run.abort import claim
    from gpuops.agent.run.attempt import ended_by

    with tmpfs(tmp_path / "runs", "1m") as d:
        (d / "exit_code").write_text("3\n")  # written before the disk filled: a command that exited 3 ...
        with full_disk(d):
            won, record = claim(str(d), {"reason": "stop", "by": "stop"})
            assert won and record["by"] == "stop"
            assert not claim(str(d), {"reason": "match", "by": "watchdog"})[0]  # one claim, whoever comes second
            assert sorted(p.name for p in d.iterdir() if p.name.startswith("abort")) == ["abort.json"]
            assert ended_by(str(d)) is None  # ... stopped: an unreadable claim is never restarted
