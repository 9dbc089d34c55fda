"""Restarts (playbook `restart:`), end to end: real sshd + pct into CT 200, real tmux, scripted fake trainers.

What a user notices is asserted: the run finishes (exit 0) after a failed first attempt, with nobody
attached or with a client following; one run id, every attempt's log kept; the `restart` event in the
watchdog's events and the client's JSON; `attempts` in the summary, `runs --json` and `status`; the
exit code of the last attempt when the restarts run out; `gpuops stop` and `--timeout` end the run for
good; a rule not in `restart.on` is not restarted.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench import FakeProxmox, SshServer, wait_until
from bench.watchdog import events, heartbeat
from test_watch import FX_LINE, SESSION, Ct, make_ct, trainer


@pytest.fixture
def ct(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Ct:
    return make_ct(sshd, fake_proxmox, tmp_path)


def with_restart(ct: Ct, command: str, restart: dict[str, Any], env: dict[str, str] | None = None,
                 notify: list[dict[str, Any]] | None = None, **options: Any) -> Path:
    """The bench playbook running `command`, with a `restart:` section (and `env`, `notify`)."""
    path = ct.playbook(command, **options)
    data = yaml.safe_load(path.read_text())
    data["restart"] = restart
    if env:
        data["env"] = env
    if notify:
        data["notify"] = notify
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fails_once(ct: Ct, first: str, then: str) -> str:
    """A training command whose first attempt runs `first` and every later one `then` (a marker file decides)."""
    mark = shlex.quote(str(ct.tmp / "attempted"))
    return (f"echo guard=${{GPUOPS_COMPILE_GUARD:-off}}; if [ -e {mark} ]; then {then}; "
            f"else touch {mark}; {first}; fi")


def detached(ct: Ct, first: str, then: str, restart: dict[str, Any], **options: Any) -> Path:
    """launch --detach of a run whose first attempt runs `first` and every later one `then`; its run directory."""
    with_restart(ct, fails_once(ct, first, then), restart, **options)
    assert ct.gpuops("launch", "--detach").code == 0
    return ct.run_dir()


def restart_events(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in events(run_dir) if e.get("event") == "restart"]


def run_over(ct: Ct) -> bool:
    """The watchdog has written its last record and nothing of the run is left."""
    return heartbeat(ct.run_dir()).get("state") == "done" and not ct.session_alive() and not ct.run_processes()


def test_an_fx_race_on_the_first_attempt_is_restarted_with_the_guard_and_the_run_succeeds_detached(ct: Ct) -> None:
    from bench.hook import Hook

    command = fails_once(ct, trainer("fx-thread"), trainer("steps", "--steps", "5"))
    with Hook() as hook:
        with_restart(ct, command, {"max": 2, "on": ["fx-tracing-race", "stall"], "compile_guard": True, "delay": 1},
                     notify=[{"webhook": hook.url, "on": ["restarted"]}])
        result = ct.gpuops("launch", "--detach", "--json")
        assert result.code == 0, result
        assert result.events()[-1]["attempts"] == 1, result
        run_id = ct.run_id()
        d = ct.run_dir()
        wait_until(lambda: run_over(ct) and hook.got, timeout=90, message="the restarted run to finish, nobody attached")
        (restarted,) = hook.of("restarted")
        (_, arrived, _), = hook.times
    # `restarted` is told once attempt 2 has started, not when its delay began.
    (started,) = [e for e in events(d) if e["event"] == "attempt_started"]
    assert arrived >= started["ts"] and (restarted["attempt"], restarted["rule"]) == (2, "fx-tracing-race"), restarted
    # One run id; attempt 1's records kept beside attempt 2's.
    assert ct.run_id() == run_id
    first = (d / "attempts" / "1" / "log").read_bytes()
    assert FX_LINE.encode() in first and b"guard=off" in first
    assert json.loads((d / "attempts" / "1" / "abort.json").read_text())["rule"] == "fx-tracing-race"
    second = ct.log()
    assert b"guard=1" in second and b"step 5/5" in second and FX_LINE.encode() not in second
    assert not (d / "abort.json").exists() and (d / "exit_code").read_text().strip() == "0"
    (restart,) = restart_events(d)
    assert (restart["attempt"], restart["max_attempts"], restart["after"], restart["compile_guard"]) == (
        2, 3, "fx-tracing-race", True)
    ct.assert_run_gone()
    # Afterwards, from any machine: the run succeeded on its second attempt.
    after = ct.gpuops("logs", "-f", "--json")
    assert after.code == 0, after
    summary = after.events()[-1]
    assert (summary["event"], summary["outcome"], summary["attempts"]) == ("summary", "succeeded", 2), summary
    (row,) = [r for r in ct.gpuops("runs", "--json").events() if r.get("run") == run_id]
    assert (row["attempts"], row["outcome"], row["exit_code"]) == (2, "succeeded", 0), row
    assert any(run_id in line and "succeeded (attempt 2)" in line for line in ct.gpuops("runs").err.splitlines()
               + ct.gpuops("runs").text.splitlines())
    status = ct.gpuops("status", "--json")
    (session,) = [s for s in status.events()[0]["sessions"] if s["session"] == SESSION]
    assert session["run"]["attempts"] == 2, session


def test_a_following_launch_follows_the_next_attempt_and_exits_0(ct: Ct) -> None:
    # Attempt 2 outlasts the follower's 15 s wait for a watchdog after a run's end: only following the
    # next attempt (not that grace) shows its end.
    command = fails_once(ct, trainer("fx-caught"), trainer("steps", "--steps", "4", "--interval", "5"))
    with_restart(ct, command, {"max": 1, "on": ["fx-tracing-race"], "delay": 1})
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    evs = result.events()
    lines = [e["line"] for e in evs if e["event"] == "log"]
    # Both attempts' logs were printed, the second from its first byte.
    assert any(FX_LINE in line for line in lines), lines
    restart_at = next(i for i, e in enumerate(evs) if e["event"] == "restart")
    assert (evs[restart_at]["attempt"], evs[restart_at]["max_attempts"], evs[restart_at]["after"]) == (
        2, 2, "fx-tracing-race")
    assert evs[restart_at]["compile_guard"] is False
    after = [e["line"] for e in evs[restart_at:] if e["event"] == "log"]
    assert after[0] == "guard=off" and "step 4/4" in after[-1], after
    summary = evs[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"], summary["attempts"]) == (
        "summary", "succeeded", 0, 2), summary
    ct.assert_run_gone()


def test_when_the_restarts_run_out_the_exit_code_is_the_last_attempts(ct: Ct) -> None:
    with_restart(ct, trainer("fx-thread"), {"max": 1, "on": ["fx-tracing-race"], "delay": 0})
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    evs = result.events()
    assert [e["attempt"] for e in evs if e["event"] == "restart"] == [2]
    summary = evs[-1]
    assert (summary["outcome"], summary["rule"], summary["attempts"]) == ("aborted", "fx-tracing-race", 2), summary
    d = ct.run_dir()
    assert FX_LINE.encode() in (d / "attempts" / "1" / "log").read_bytes() and FX_LINE.encode() in ct.log()
    assert not (d / "attempts" / "2").exists()  # the last attempt's records are the run's own
    ct.assert_run_gone()


def test_a_rule_not_in_restart_on_ends_the_run_with_no_restart(ct: Ct) -> None:
    with_restart(ct, trainer("oom"), {"max": 2, "on": ["fx-tracing-race"], "delay": 0})
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    assert result.events()[-1]["rule"] == "cuda-oom" and result.events()[-1]["attempts"] == 1
    assert restart_events(ct.run_dir()) == [] and not (ct.run_dir() / "attempts").exists()


def test_failed_restarts_a_training_that_exited_non_zero_without_a_rule(ct: Ct) -> None:
    command = fails_once(ct, trainer("exit", "--steps", "2", "--code", "3"), trainer("steps", "--steps", "2"))
    with_restart(ct, command, {"max": 1, "on": ["failed"], "delay": 0})
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    (restart,) = [e for e in result.events() if e["event"] == "restart"]
    assert restart["after"] == "failed"
    assert (ct.run_dir() / "attempts" / "1" / "exit_code").read_text().strip() == "3"


def test_stall_restarts_a_hung_attempt(ct: Ct) -> None:
    command = fails_once(ct, trainer("hang"), trainer("steps", "--steps", "2"))
    with_restart(ct, command, {"max": 1, "on": ["stall"], "delay": 0}, stall=2)
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    (restart,) = [e for e in result.events() if e["event"] == "restart"]
    assert restart["after"] == "stall"
    assert json.loads((ct.run_dir() / "attempts" / "1" / "abort.json").read_text())["reason"] == "stall"
    ct.assert_run_gone()


def test_stop_during_the_restart_delay_ends_the_run_for_good(ct: Ct) -> None:
    from bench.hook import Hook
    from test_notify import notify_done

    with Hook() as hook:  # told `aborted`, then `ended` saying why: never `restarted` for a restart that never ran
        d = detached(ct, trainer("fx-thread"), trainer("steps", "--steps", "3"),
                     {"max": 2, "on": ["fx-tracing-race"], "delay": 60}, notify=[{"webhook": hook.url}])
        wait_until(lambda: restart_events(d), timeout=60, message="the restart of the first attempt")
        status = ct.gpuops("status", "--json")
        (session,) = [s for s in status.events()[0]["sessions"] if s["session"] == SESSION]
        assert (session["run"]["state"], session["run"]["attempts"]) == ("restarting", 2), session
        stopped = ct.gpuops("stop", "--json")
        assert stopped.code == 0, stopped
        assert (stopped.events()[-1]["outcome"], stopped.events()[-1]["attempts"]) == ("stopped", 2), stopped
        wait_until(lambda: run_over(ct), timeout=60, message="the watchdog to end the run")
        wait_until(lambda: notify_done(ct, 2), timeout=30, message="the ended notification")
        assert hook.whats() == ["aborted", "ended"], hook.whats()
        (ended,) = hook.of("ended")
    assert ended["restart_failed"] == "attempt 2 never started: the run was stopped by gpuops stop while it waited"
    assert ended["restart_failed"] in ended["text"]
    assert json.loads((d / "abort.json").read_text())["by"] == "stop"
    assert not (d / "started").exists() and not (d / "log").exists()  # attempt 2 never started
    kinds = [e["event"] for e in events(d)]
    assert "restart_cancelled" in kinds and "attempt_started" not in kinds
    after = ct.gpuops("logs", "-f", "--json")
    assert after.events()[-1]["outcome"] == "stopped", after


def test_timeout_is_one_budget_over_all_attempts(ct: Ct) -> None:
    # Each attempt fails within a second and waits 2 s: without one budget, the run would go on restarting.
    with_restart(ct, trainer("fx-thread"), {"max": 10, "on": ["fx-tracing-race"], "delay": 2})
    result = ct.gpuops("launch", "--json", "--timeout", "8")
    assert result.code == 124, result
    evs = result.events()
    assert [e["event"] for e in evs if e["event"] == "restart"], "no restart before the timeout"
    assert evs[-1]["outcome"] == "timeout", evs[-1]
    wait_until(lambda: run_over(ct), timeout=60, message="the watchdog to end the run")
    n = len(restart_events(ct.run_dir()))
    assert n < 10 and json.loads((ct.run_dir() / "abort.json").read_text())["by"] == "timeout"
    ct.assert_run_gone()


def test_junit_shows_each_attempt_as_a_testcase(ct: Ct, tmp_path: Path) -> None:
    from test_junit import cases, report, verdict

    command = fails_once(ct, trainer("fx-thread"), trainer("steps", "--steps", "3"))
    with_restart(ct, command, {"max": 2, "on": ["fx-tracing-race"], "delay": 0})
    path = tmp_path / "junit.xml"
    result = ct.gpuops("launch", "--junit", str(path))
    assert result.code == 0, result
    found = cases(report(path))
    assert list(found) == ["preflight", "training (attempt 1)", "training (attempt 2)"], list(found)
    first = verdict(found["training (attempt 1)"], "failure")
    assert "ended by 'fx-tracing-race'" in first.get("message", "") and FX_LINE in (first.text or "")
    assert found["training (attempt 2)"][0] == "passed"


def test_the_restarted_attempt_runs_under_the_compile_guard_with_the_playbooks_pythonpath_kept(ct: Ct) -> None:
    standins = Path(__file__).resolve().parents[1] / "standins"  # the strict stand-in torch
    probe = ct.tmp / "which_compile.py"
    probe.write_text("import os, torch\n"
                     "print('compile', 'guarded' if getattr(torch.compile, '_gpuops_compile_guard', False) else 'bare')\n"
                     "print('pythonpath', os.environ.get('PYTHONPATH'))\n")
    check = f"python3 {shlex.quote(str(probe))}"
    command = fails_once(ct, f"{check}; {trainer('fx-thread')}", check)
    with_restart(ct, command, {"max": 1, "on": ["fx-tracing-race"], "compile_guard": True, "delay": 0},
                 env={"PYTHONPATH": str(standins)})
    result = ct.gpuops("launch")
    assert result.code == 0, result
    first, second = (ct.run_dir() / "attempts" / "1" / "log").read_text(), ct.log().decode()
    assert "compile bare" in first and "guard=off" in first, first
    assert "compile guarded" in second and "guard=1" in second, second
    path = next(line for line in second.splitlines() if line.startswith("pythonpath ")).split(" ", 1)[1].split(":")
    assert path[0].endswith("gpuops_agent/guard/pythonpath") and path[1:] == [str(standins)], path


def test_a_watchdog_killed_while_the_next_attempt_waits_comes_back_and_restarts_it(ct: Ct) -> None:
    import os
    import signal

    from bench import procs

    d = detached(ct, trainer("fx-thread"), trainer("steps", "--steps", "3"),
                 {"max": 1, "on": ["fx-tracing-race"], "delay": 4})
    wait_until(lambda: heartbeat(d).get("state") == "restarting" and restart_events(d), timeout=60,
               message="the next attempt to wait out its delay")
    pid = heartbeat(d)["pid"]
    os.kill(pid, signal.SIGKILL)  # in the delay: its supervisor starts a new watchdog, which carries on
    wait_until(lambda: not procs.is_alive(pid), timeout=30, message="the watchdog to die")
    wait_until(lambda: run_over(ct), timeout=90, message="the restarted attempt to finish")
    assert (d / "exit_code").read_text().strip() == "0" and b"step 3/3" in ct.log()
    assert len(restart_events(d)) == 1  # one restart, not one per watchdog
    assert [e["attempt"] for e in events(d) if e.get("event") == "attempt_started"] == [2]
    after = ct.gpuops("logs", "-f", "--json")
    assert (after.code, after.events()[-1]["attempts"]) == (0, 2), after


def test_warmup_true_runs_the_warmup_again_before_the_restarted_attempt(ct: Ct) -> None:
    command = fails_once(ct, trainer("fx-thread"), trainer("steps", "--steps", "2"))
    path = with_restart(ct, command, {"max": 1, "on": ["fx-tracing-race"], "delay": 0, "warmup": True})
    data = yaml.safe_load(path.read_text())
    data["warmup"] = {"gpus": [5, 6], "command": "fake-warmup --gpu {gpu} --duration 0.2 --steps 2"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    d = ct.run_dir()
    for gpu in (5, 6):  # launch's warmup and the restart's, one after the other, in the GPU's log
        assert (d / f"warmup-{gpu}.log").read_text().count(f"[warmup gpu{gpu}] done in") == 2, gpu
    (restart,) = [e for e in result.events() if e["event"] == "restart"]
    assert restart["warmup"] is True
    ct.assert_run_gone()


def test_stop_while_the_watchdog_aborts_an_attempt_that_would_be_restarted_ends_the_run_for_good(ct: Ct) -> None:
    # Attempt 1 ignores Ctrl-C, so its abort waits out the grace: `gpuops stop` comes in that window, loses the
    # claim to the watchdog's abort, and must still end the run rather than let the restart go on.
    d = detached(ct, f"trap '' INT; {trainer('fx-thread')}", trainer("steps", "--steps", "300"),
                 {"max": 2, "on": ["fx-tracing-race"], "delay": 0}, grace=4)
    wait_until(lambda: (d / "abort.json").exists() and ct.session_alive(), timeout=60,
               message="the watchdog's abort of attempt 1, in its grace")
    stopped = ct.gpuops("stop")
    assert stopped.code == 0, stopped
    wait_until(lambda: run_over(ct), timeout=60, message="the run to end")
    assert json.loads((d / "attempts" / "1" / "abort.json").read_text())["by"] == "watchdog"
    assert json.loads((d / "abort.json").read_text())["by"] == "stop"
    # With no delay, attempt 2 may have begun before the stop's claim: it is stopped then, and never restarted.
    assert len(restart_events(d)) == 1 and not (d / "attempts" / "2").exists()
    assert b"step 300/300" not in (ct.log() if (d / "log").exists() else b""), (events(d), stopped.text, stopped.err,
        (d / "abort.json").read_text(), (d / "abort-done.json").read_text() if (d / "abort-done.json").exists() else None)
    after = ct.gpuops("logs", "-f", "--json")
    assert after.events()[-1]["outcome"] == "stopped", after
    ct.assert_run_gone()
