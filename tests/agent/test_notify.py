"""Notifications from the target, end to end: real sshd + pct into CT 200, real tmux, the watchdog with nobody
attached, and a real HTTP hook on 127.0.0.1 (tests/bench/hook.py).

What the operator notices is asserted: one `aborted` notification with the rule and the run id, then `ended`
with exit code 7; a hook that never answers changes nothing about the abort or launch; a secret URL reaches
its hook and no output; a watchdog killed and started again sends no second copy; `notify-test` prints each
channel's answer; a command channel gets the payload and its line in its env.
"""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path
from typing import Any

import yaml
from bench import procs, wait_until
from bench.hook import Hook
from bench.watchdog import events, kill_watchdog, wait_watching
from test_watch import FX_LINE, Ct, trainer
from test_watchdog import go_file, run_stopped


def with_notify(ct: Ct, command: str, channels: list[dict[str, Any]], **options: Any) -> Path:
    path = ct.playbook(command, **options)
    data = yaml.safe_load(path.read_text())
    data["notify"] = channels
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def notify_done(ct: Ct, keys: int) -> bool:
    """The run's senders finished `keys` notifications (notify.jsonl says done for each)."""
    try:
        lines = (ct.run_dir() / "notify.jsonl").read_text().splitlines()
    except OSError:
        return False
    return sum(json.loads(x).get("state") == "done" for x in lines) >= keys


def test_a_detached_run_hit_by_the_fx_race_notifies_aborted_once_then_ended_with_exit_7(ct: Ct) -> None:
    go, opt = go_file(ct)
    with Hook() as hook:
        with_notify(ct, trainer("fx-thread", opt), [{"webhook": hook.url}])
        assert ct.gpuops("launch", "--detach").code == 0
        run_id = ct.run_id()
        wait_watching(ct.run_dir())
        ct.wait_training()
        go.touch()  # the race, with nobody attached
        wait_until(lambda: hook.of("aborted"), timeout=30, message="the aborted notification")
        wait_until(lambda: hook.of("ended") and notify_done(ct, 2), timeout=30, message="the ended notification")
        (aborted,) = hook.of("aborted")
        assert (aborted["run"], aborted["rule"], aborted["exit_code"], aborted["target"]) == (
            run_id, "fx-tracing-race", 7, "ct200")
        assert FX_LINE in aborted["excerpt"] and run_id in aborted["text"]
        (ended,) = hook.of("ended")
        assert (ended["exit_code"], ended["outcome"], ended["rule"]) == (7, "aborted", "fx-tracing-race")
        assert hook.whats() == ["aborted", "ended"]
        # Each delivery is an event of the run, which a following client shows.
        sent = [e for e in events(ct.run_dir()) if e["event"] == "notify_sent"]
        assert sorted((e["what"], e["status"]) for e in sent) == [("aborted", 200), ("ended", 200)]
        after = ct.gpuops("logs", "-f")
        assert after.code == 7
        assert "notified (aborted) through webhook channel 1: HTTP 200" in after.err, after
        assert ct.gpuops("logs", "-f", "--json").code == 7  # its notify_* lines validate in the schema


def test_a_hook_that_never_answers_leaves_the_abort_and_launch_as_they_are(ct: Ct) -> None:
    with Hook(answer=None) as hook:
        with_notify(ct, trainer("fx-thread"), [{"webhook": hook.url}])
        result = ct.gpuops("launch")
        # launch returned with the run aborted while the hook still holds the aborted notification's connection.
        assert result.code == 7, result
        assert hook.open >= 1 and hook.whats()[:1] == ["aborted"]
        # ... and inside its first try: no answer recorded, no second try yet.
        assert len(hook.of("aborted")) == 1
        assert not [e for e in events(ct.run_dir()) if e["event"].startswith("notify_")]
        assert run_stopped(ct) and (ct.run_dir() / "abort-done.json").exists()
        assert "ABORT: rule 'fx-tracing-race' matched" in result.err


def test_a_secret_url_reaches_its_hook_and_appears_in_no_output(ct: Ct) -> None:
    secret_path = "/services/T0/B0/s3cr3t-hook-4242"
    with Hook(path=secret_path) as hook, Hook(404, path=secret_path) as refusing:
        env = {"GPUOPS_TEST_HOOK": hook.url, "GPUOPS_TEST_REFUSING": refusing.url}
        with_notify(ct, trainer("fx-thread"), [{"webhook": {"from_env": "GPUOPS_TEST_HOOK", "secret": True}},
                                                {"webhook": {"from_env": "GPUOPS_TEST_REFUSING"}, "on": ["ended"]}])
        outputs = [ct.gpuops("launch", "--dry-run", env=env), ct.gpuops("launch", env=env)]
        assert outputs[1].code == 7, outputs[1]
        wait_until(lambda: hook.of("ended") and notify_done(ct, 2), timeout=30, message="both notifications")
        assert hook.paths == [secret_path, secret_path] and refusing.paths == [secret_path]
        (failed,) = [e for e in events(ct.run_dir()) if e["event"] == "notify_failed"]
        assert failed["status"] == 404 and "HTTP 404" in failed["reason"]
        outputs += [ct.gpuops(c, *a, env=env) for c, a in (("status", ()), ("runs", ()), ("logs", ()),
                                                             ("status", ("--json",)), ("runs", ("--json",)))]
        outputs.append(ct.gpuops("notify-test", env=env))
    shown = b"".join(o.out + o.err.encode() for o in outputs)
    assert b"s3cr3t-hook-4242" not in shown and b"***" in outputs[0].out + outputs[0].err.encode()
    # In the run directory only watch.json (mode 0600, as for the env's secrets) holds it.
    holding = [p.name for p in ct.run_dir().rglob("*") if p.is_file() and b"s3cr3t-hook-4242" in p.read_bytes()]
    assert holding == ["watch.json"]
    assert oct((ct.run_dir() / "watch.json").stat().st_mode & 0o777) == "0o600"


def test_a_watchdog_killed_and_started_again_sends_no_second_copy(ct: Ct) -> None:
    rule = [{"name": "boom", "pattern": r"^step 5/", "action": "abort"}]
    with Hook() as hook:
        # The trainer ignores Ctrl-C: the abort lasts its 3 s grace, and the watchdog is killed inside it.
        with_notify(ct, trainer("ignore-int"), [{"webhook": hook.url}], rules=rule, grace=3)
        assert ct.gpuops("launch", "--detach").code == 0
        wait_until(lambda: hook.of("aborted"), timeout=30, message="the aborted notification")
        kill_watchdog(ct.run_dir())  # its supervisor starts another, which sees the claimed abort again
        wait_until(lambda: any(e["event"] == "watchdog_restarted" for e in events(ct.run_dir())), timeout=30,
                   message="the supervisor to start the watchdog again")
        wait_until(lambda: hook.of("ended") and notify_done(ct, 2), timeout=60, message="the ended notification")
        assert ct.gpuops("logs", "-f").code == 7
        assert hook.whats() == ["aborted", "ended"]
        assert [e["what"] for e in events(ct.run_dir()) if e["event"] == "notify_sent"] == ["aborted", "ended"]


def test_notify_test_prints_each_channels_answer_and_the_command_gets_its_env(ct: Ct) -> None:
    marker = ct.tmp / "command-saw"
    command = (f'{{ echo "$GPUOPS_NOTIFY_TEXT"; cat "$GPUOPS_NOTIFY_JSON"; echo "$PLAIN_SETTING"; }} > "{marker}"; '
               'echo the command ran')
    with Hook() as hook:
        path = with_notify(ct, trainer("steps"), [{"webhook": hook.url, "format": "slack"},
                                                  {"webhook": "http://127.0.0.1:1/refused"}, {"command": command}])
        data = yaml.safe_load(path.read_text())
        data["env"] = {"PLAIN_SETTING": "from-the-playbook"}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        result = ct.gpuops("notify-test")
        assert result.code == 9, result
        assert "notified (test) through webhook channel 1: HTTP 200" in result.err
        assert "NOTIFICATION FAILED (test) through webhook channel 2: cannot reach the hook" in result.err
        assert "notified (test) through command channel 3: exit 0; it printed: the command ran" in result.err
        assert hook.got and set(hook.got[0]) == {"text"} and "test notification" in hook.got[0]["text"]
        as_json = ct.gpuops("notify-test", "--json")
        assert [e["event"] for e in as_json.events()] == ["notify_sent", "notify_failed", "notify_sent", "summary"]
    text, payload_json, plain = marker.read_text().splitlines()[0], marker.read_text().splitlines()[1], \
        marker.read_text().splitlines()[-1]
    assert json.loads(payload_json)["what"] == "test" and "test notification" in text
    assert plain == "from-the-playbook"  # the playbook's env, as the training gets it


def test_a_command_channel_runs_on_the_target_with_the_payload_when_the_run_ends(ct: Ct) -> None:
    out = ct.tmp / "ended-note"
    with_notify(ct, trainer("steps", "--steps", "3"), [
        {"on": ["ended"], "command": f'echo "$GPUOPS_NOTIFY_TEXT" > "{out}"; cp "$GPUOPS_NOTIFY_JSON" "{out}.json"'}])
    assert ct.gpuops("launch").code == 0
    wait_until(lambda: notify_done(ct, 1), timeout=30, message="the ended notification")
    payload = json.loads(Path(f"{out}.json").read_text())
    assert (payload["what"], payload["exit_code"], payload["outcome"]) == ("ended", 0, "succeeded")
    assert "SUCCEEDED" in out.read_text() and ct.run_id() in out.read_text()
    (sent,) = [e for e in events(ct.run_dir()) if e["event"] == "notify_sent"]
    assert sent["exit"] == 0 and Path(sent["output"]).parent == ct.run_dir() / "notify"
    assert not [p for p in procs.find(lambda env: env.get(b"GPUOPS_NOTIFY_JSON") is not None) if p != os.getpid()]


def test_notify_test_reports_a_redirect_a_trickle_and_a_hostile_phrase_as_failures_and_shows_no_password(ct: Ct) -> None:
    with Hook(redirect="/elsewhere") as redirecting, Hook(trickle=True) as trickling, \
            Hook(500, phrase="\x1b]0;owned\x07\x1b[2JBoom") as hostile, Hook(path="/T0/s3cr3t-tok") as guarded:
        env = {"GPUOPS_TEST_HOOK": f"http://user:pa55word@127.0.0.1:{guarded.port}/T0/s3cr3t-tok",
               "GPUOPS_TEST_PORTLESS": "http://user:pa55word@127.0.0.1/T0/s3cr3t-tok"}
        with_notify(ct, trainer("steps"), [{"webhook": redirecting.url}, {"webhook": trickling.url},
                                           {"webhook": hostile.url}, {"webhook": {"from_env": "GPUOPS_TEST_HOOK"}},
                                           {"webhook": {"from_env": "GPUOPS_TEST_PORTLESS"}}])
        text = ct.gpuops("notify-test", env=env, timeout=60)  # a trickle held a try for hours
        as_json = ct.gpuops("notify-test", "--json", env=env, timeout=60)
        assert redirecting.gets == [] and guarded.auth[0] == "Basic " + base64.b64encode(b"user:pa55word").decode()
    assert text.code == as_json.code == 9, text
    assert "NOTIFICATION FAILED (test) through webhook channel 1: HTTP 302 Found: the hook redirects" in text.err, text
    assert "channel 2: HTTP 200 but the answer did not end within 10s" in text.err
    assert "notified (test) through webhook channel 4: HTTP 200" in text.err
    answers = {e["channel"]: e for e in as_json.events()[:-1]}
    assert [answers[n]["event"] for n in range(1, 6)] == ["notify_failed", "notify_failed", "notify_failed",
                                                          "notify_sent", "notify_failed"], answers
    assert answers[3]["reason"] == "HTTP 500 \\x1b]0;owned\\x07\\x1b[2JBoom"  # the hook's words, never acted on
    shown = text.out + text.err.encode() + as_json.out + as_json.err.encode()
    assert b"pa55word" not in shown and b"s3cr3t" not in shown and b"\x1b" not in shown


def test_notify_test_killed_leaves_nothing_of_it_on_the_target(ct: Ct) -> None:
    marker = ct.tmp / "slow-command"
    root = str(ct.fake.root).encode()

    def left() -> list[int]:
        return [pid for pid in procs.find(lambda env: any(root in v for v in env.values()))
                if b"notify-test" in _cmdline(pid) or str(marker).encode() in _cmdline(pid)]

    with Hook(trickle=True) as trickling:
        with_notify(ct, trainer("steps"), [{"webhook": trickling.url}, {"command": f"sleep 25; touch {marker}"}])
        running = ct.start("notify-test")
        running.wait_for(lambda: trickling.got and left(), "the notify-test agent to try both channels")
        running.signal(signal.SIGKILL)  # no chance to tidy up: its ssh (in a session of its own) lives on
        assert running.finish(timeout=30).code == -signal.SIGKILL
        wait_until(lambda: not left(), timeout=8, message="notify-test's agent and its command to end with it")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_an_event_this_gpuops_does_not_know_leaves_logs_with_the_runs_exit_code(ct: Ct) -> None:
    from gpuops.agent.wire.protocol import SCHEMA_VERSION

    with_notify(ct, trainer("fx-thread"), [{"webhook": "http://127.0.0.1:1/hook"}])
    assert ct.gpuops("launch").code == 7
    newer = SCHEMA_VERSION + 1
    with open(ct.run_dir() / "events.jsonl", "a") as fh:  # a newer agent's records
        for record in ({"event": "notify_escalated", "what": "aborted", "kind": "pager", "channel": 1},
                       {"event": "notify_sent", "what": "aborted", "kind": "webhook", "channel": 1, "via": "webhook",
                        "status": 200},
                       {"event": "note", "what": "surprise", "kind": "x", "message": "a newer note"}):
            fh.write(json.dumps({"schema_version": newer, "ts": 1.0, "by": "watchdog", **record}) + "\n")
    assert ct.gpuops("logs").code == 0
    followed = ct.gpuops("logs", "-f")
    assert followed.code == 7, followed
    assert followed.err.count("was written by a newer gpuops") == 1, followed.err
    as_json = ct.gpuops("logs", "-f", "--json")  # every line valid in this gpuops' schema (bench.cli checks)
    assert as_json.code == 7, as_json
    unknown = [e for e in as_json.events() if e["event"] == "unknown_event"]
    assert [(e["name"], e["record"].get("kind")) for e in unknown] == [
        ("notify_escalated", "pager"), ("notify_sent", "webhook"), ("note", "x")], unknown
