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


def with_restart(ct: Ct, command: str, restart: dict[str, Any], **options: Any) -> Path:
    """The bench playbook running `command`, with a `restart:` section."""
    path = ct.playbook(command, **options)
    data = yaml.safe_load(path.read_text())
    data["restart"] = restart
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fails_once(ct: Ct, first: str, then: str) -> str:
    """A training command whose first attempt runs `first` and every later one `then` (a marker file decides)."""
    mark = shlex.quote(str(ct.tmp / "attempted"))
    return (f"echo guard=${{GPUOPS_COMPILE_GUARD:-off}}; if [ -e {mark} ]; then {then}; "
            f"else touch {mark}; {first}; fi")


def restart_events(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in events(run_dir) if e.get("event") == "restart"]


def run_over(ct: Ct) -> bool:
    """The watchdog has written its last record and nothing of the run is left."""
    return heartbeat(ct.run_dir()).get("state") == "done" and not ct.session_alive() and not ct.run_processes()


def test_an_fx_race_on_the_first_attempt_is_restarted_with_the_guard_and_the_run_succeeds_detached(ct: Ct) -> None:
    command = fails_once(ct, trainer("fx-thread"), trainer("steps", "--steps", "5"))
    with_restart(ct, command, {"max": 2, "on": ["fx-tracing-race", "stall"], "compile_guard": True, "delay": 1})
    result = ct.gpuops("launch", "--detach")
    assert result.code == 0, result
    run_id = ct.run_id()
    d = ct.run_dir()
    wait_until(lambda: run_over(ct), timeout=90, message="the restarted run to finish with nobody attached")
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
    status = ct.gpuops("status", "--json")
    (session,) = [s for s in status.events()[0]["sessions"] if s["session"] == SESSION]
    assert session["run"]["attempts"] == 2, session
