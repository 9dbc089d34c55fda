"""Defects found by trying to break gpuops (issue #11), each tried the way an attacker or an unlucky user
would, on the real-sshd bench: a user regex that backtracks forever, secrets at the cut of a shortened
text, two playbooks on the same GPUs, a large env value, an SSH drop during warmup."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest
import yaml
from bench import wait_until
from bench.watchdog import remove_watchdog
from test_launch import Lab, base_playbook, gpuops, lab, merged  # noqa: F401 (lab: the fixture)
from test_watch import SESSION, Ct, trainer

CATASTROPHIC = r"(a+)+$"
FX_SAMPLE = Path(__file__).parent / "data" / "logs" / "fx_race_thread.txt"


def printer(ct: Ct, name: str, text: str, *, then: str = "") -> str:
    """A job that prints `text` (from a file next to the playbook), then runs `then`."""
    path = ct.tmp / name
    path.write_text(text)
    return f"cat {shlex.quote(str(path))}" + (f"; {then}" if then else "")


# -- 1. a catastrophic user regex must not switch off the safeguards --------------------------------
def redos_rules() -> list[dict[str, str]]:
    return [{"name": "all-a", "pattern": CATASTROPHIC, "action": "abort"}]


def test_validate_warns_about_a_pattern_that_backtracks_catastrophically(ct: Ct) -> None:
    pb = ct.playbook("true", rules=redos_rules())
    result = ct.gpuops("validate")
    assert result.code == 0, result
    assert "warning:" in result.err and "all-a" in result.err, result
    assert str(pb) in result.err


@pytest.mark.parametrize("who", ["watchdog", "client"])
def test_the_fx_race_after_a_catastrophic_line_is_still_aborted(ct: Ct, who: str) -> None:
    job = printer(ct, "redos.txt", "a" * 40 + "b\n", then=f"sleep 1; cat {shlex.quote(str(FX_SAMPLE))}; "
                  + trainer("steps", "--steps", "100000"))
    if who == "watchdog":
        ct.playbook(job, rules=redos_rules())
        started = time.monotonic()
        result = ct.gpuops("launch", "--json")
    else:  # the watchdog is gone: a following client guards the run with the same rules
        go = ct.tmp / "go"
        ct.playbook(f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done; {job}", rules=redos_rules())
        assert ct.gpuops("launch", "--detach").code == 0
        remove_watchdog(ct.run_dir())
        follower = ct.start("logs", "-f", "--json")
        follower.wait_for(lambda: '"event": "watchdog_stale"' in follower.out, "the client to watch the run")
        started = time.monotonic()
        go.touch()
        result = follower.finish()
    assert result.code == 7, result
    events = result.events()
    disabled = [e for e in events if e["event"] == "rule_disabled"]
    assert [e["rule"] for e in disabled] == ["all-a"] and disabled[0]["by"] == who
    assert events[-1]["rule"] == "fx-tracing-race" and ct.abort_record()["by"] == who
    assert time.monotonic() - started < 60  # unguarded, the regex alone takes far longer
    ct.assert_run_gone()


def test_timeout_is_honoured_whatever_a_user_rule_does(ct: Ct) -> None:
    lines = ("a" * 40 + "b\n") * 3
    ct.playbook(printer(ct, "redos.txt", lines, then=trainer("steps", "--steps", "100000")), rules=redos_rules())
    started = time.monotonic()
    result = ct.gpuops("launch", "--timeout", "10")
    assert result.code == 124, result
    assert time.monotonic() - started < 60
    assert ct.abort_record()["reason"] == "timeout"
    ct.assert_run_gone()


# -- 2. a secret straddling the cut of a shortened text -----------------------------------------------
SECRET = "hf_" + "Zq8Xv2Lm9Tr4Wp7Ks1Nd"  # 23 characters


def leaked_pieces(text: str, secret: str = SECRET) -> list[str]:
    return [secret[i : i + 8] for i in range(len(secret) - 7) if secret[i : i + 8] in text]


def every_said_text(ct: Ct, result) -> str:
    """Everything gpuops said or wrote about the run (the job's own log aside)."""
    run = ct.run_dir()
    said = [result.err, "\n".join(json.dumps(e) for e in result.events() if e["event"] != "log")]
    for name in ("abort.json", "meta.json", "events.jsonl", "abort-done.json", "watchdog.json"):
        if (run / name).exists():
            said.append((run / name).read_text())
    said.append(ct.gpuops("status").text + ct.gpuops("status", "--json").text)
    return "\n".join(said)


@pytest.mark.parametrize("cut", [995, 1000, 1005])
def test_a_secret_at_the_excerpt_cut_shows_no_piece_of_itself(ct: Ct, cut: int) -> None:
    line = "RuntimeError: boom " + "x" * (cut - 19 - 10) + SECRET + " end"
    tb = "Traceback (most recent call last):\n  File \"t.py\", line 1, in f\n    f()\n" + line + "\n"
    rules = [{"name": "boom", "pattern": "boom", "action": "abort"}]
    ct.playbook(printer(ct, "tb.txt", tb, then="sleep 30"), rules=rules)
    _with_env(ct, {"HF_TOKEN": SECRET})
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    assert leaked_pieces(every_said_text(ct, result)) == []


def test_a_secret_at_the_cut_of_a_failed_runs_last_line_shows_no_piece_of_itself(ct: Ct) -> None:
    line = "fatal: " + SECRET + " " + "z" * 285  # the last 300 characters begin inside the secret
    ct.playbook(printer(ct, "last.txt", line + "\n", then="exit 3"))
    _with_env(ct, {"HF_TOKEN": SECRET})
    result = ct.gpuops("launch", "--json")
    assert result.code == 6, result
    assert result.events()[-1]["last_line"].endswith("z" * 200)
    assert leaked_pieces(every_said_text(ct, result)) == []


def _with_env(ct: Ct, env: dict[str, str]) -> None:
    import yaml

    path = ct.tmp / "playbook.yaml"
    data = yaml.safe_load(path.read_text())
    data["env"] = env
    path.write_text(yaml.safe_dump(data, sort_keys=False))


# -- 4. two playbooks on the same GPUs ---------------------------------------------------------------
def test_two_playbooks_on_the_same_gpus_one_runs_the_other_exits_4(lab: Lab) -> None:  # noqa: F811
    release = lab.dir / "release"
    warm = f"while [ ! -e {release} ]; do sleep 0.05; done; fake-warmup --gpu {{gpu}} --duration 0.2 --steps 1"
    books = []
    for name in ("alpha", "beta"):  # the same but for their names and tmux sessions
        path = lab.dir / f"{name}.yaml"
        changes = {"name": name, "warmup": {"command": warm},
                   "launch": {"session": name, "command": "fake-train --mode steps --steps 100000 --gpus 5,6,7"}}
        path.write_text(yaml.safe_dump(merged(base_playbook(), changes), sort_keys=False))
        books.append(path)
    launchers = [lab.popen(pb, "--detach") for pb in books]
    try:
        wait_until(lambda: any(p.poll() is not None for p in launchers), timeout=90, message="one launcher to give up")
    finally:
        release.touch()
    results = [(p.returncode if p.poll() is not None else p.wait(timeout=120), p.communicate(timeout=120)) for p in launchers]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 4], results
    loser_err = next(err for code, (_, err) in results if code == 4)
    assert "belongs to another launch" in loser_err and "session " in loser_err, loser_err
    starts = [gpu for event, gpu, _ in lab.warmups() if event == "start"]
    assert sorted(starts) == [5, 6, 7]  # each GPU warmed once: no overlapping warmups
    # While the winner's run lives, its GPUs stay its own, whatever the playbook.
    winner = next(pb for pb, (code, _) in zip(books, results, strict=True) if code == 0)
    other = books[1] if winner == books[0] else books[0]
    again = lab.launch(other)
    assert again.returncode == 4 and "belongs to another run" in again.stderr, again.stderr
    stopped = gpuops("stop", "-i", str(lab.inventory), "-p", str(winner))
    assert stopped.returncode == 0, stopped.stderr


# -- 5. a large env value ---------------------------------------------------------------------------
def test_a_70_kb_env_value_reaches_the_job_and_the_run_reads_back_whole(ct: Ct) -> None:
    value = "v" * 70_000
    ct.playbook("printf '%s' \"$BIG\" | wc -c")
    _with_env(ct, {"BIG": value})
    result = ct.gpuops("launch")
    assert result.code == 0, result
    assert result.out.strip().endswith(b"70000")
    (session,) = [s for s in ct.gpuops("status", "--json").events()[0]["sessions"] if s["session"] == SESSION]
    assert session["run"]["playbook"] == "watch-test" and session["run"]["started_at"]


def test_an_env_value_over_the_kernels_limit_is_refused_before_anything_runs(ct: Ct) -> None:
    ct.playbook("true")
    _with_env(ct, {"BIG": "v" * 150_000})
    for command in ("validate", "launch"):
        result = ct.gpuops(command)
        assert result.code == 2, result
        assert "131072" in result.err or "128 KiB" in result.err, result
    assert not (ct.fake.home(200) / ".gpuops" / "runs").exists()


# -- 7. an SSH drop during warmup ---------------------------------------------------------------------
def test_an_ssh_drop_during_warmup_is_a_connection_failure_not_a_warmup_exit_code(lab: Lab) -> None:  # noqa: F811
    pb = lab.playbook(warmup={"gpus": [5], "command": "fake-warmup --gpu {gpu} --duration 30 --steps 30"})
    launcher = lab.popen(pb)
    wait_until(lambda: any(e == "start" for e, _, _ in lab.warmups()), timeout=60, message="the warmup to start")
    assert lab.sshd.kill_connections() >= 1
    out, err = launcher.communicate(timeout=180)
    assert launcher.returncode == 3, err
    assert "the connection was lost during the warmup on GPU 5" in err and "exited with code -1" not in err, err
    wait_until(lambda: not lab.procs("fake-warmup"), timeout=60, message="the warmup to be stopped")
    assert not lab.session_alive()
    # The next launch finds no launcher that died: no stale lock to report.
    again = lab.launch(lab.playbook(warmup=None), "--json")
    assert again.returncode == 0, again.stderr
    events = [json.loads(line) for line in again.stdout.splitlines()]
    assert not any(e["event"] == "lock_recovered" for e in events), events
