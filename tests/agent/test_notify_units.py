"""Notifications, in process: the playbook's `notify:` (FILE:LINE:COL errors), the payload (valid in `gpuops
schema`, one line a person reads), and one delivery against a real HTTP server on 127.0.0.1 (an answer, an
error worth retrying or not, a hook that never answers, one that redirects or trickles its answer, a
hostile reason phrase, a secret URL kept out of every reason), a command channel's output and env, and
the order in which one channel gets a run's notifications."""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import jsonschema
import pytest
from bench.hook import Hook
from bench.playbooks import playbook_error, write_playbook

from gpuops.agent.notify import deliver, outbox, payload, sender, webhook
from gpuops.agent.wire.masking import Masker
from gpuops.agent.wire.watchfile import channel, parse
from gpuops.cli.renderers.json_schema import schema
from gpuops.config import load_playbook

HEAD = "launch: {session: s, command: train}\n"


def validate(obj: dict) -> None:
    full = schema()
    jsonschema.Draft202012Validator({"$ref": f"#/$defs/{obj['event']}", "$defs": full["$defs"]},
                                    format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).validate(obj)


def test_channels_read_with_their_defaults_and_a_secret_url_from_the_environment(tmp_path: Path) -> None:
    path = write_playbook(tmp_path, HEAD, """\
        notify:
          - webhook: {from_env: HOOK_URL}
          - on: [ended, warned]
            webhook: https://hooks.example.org/x
            format: slack
          - on: [stalled]
            command: 'mail -s "$GPUOPS_NOTIFY_TEXT" me@example.org </dev/null'
        """)
    pb = load_playbook(path, environ={"HOOK_URL": "https://hooks.example.org/T0/B0/s3cr3t"})
    first, second, third = pb.notify
    assert (first.on, first.settings.secret, first.settings.format, first.settings.webhook) == (
        ("aborted", "restarted", "ended"), True, "json", "https://hooks.example.org/T0/B0/s3cr3t")
    assert (second.on, second.settings.secret, second.settings.format) == (("ended", "warned"), False, "slack")
    assert third.settings.command and third.on == ("stalled",)
    assert [c.kind for c in pb.notify] == ["webhook", "webhook", "command"]  # each channel's kind, named
    assert "https://hooks.example.org/T0/B0/s3cr3t" in pb.secrets  # masked wherever gpuops speaks
    assert first.shown == "webhook ***"


@pytest.mark.parametrize(("text", "where", "said"), [
    ("notify: {webhook: http://x}\n", "2:9", "expected a list of notification channels"),
    ("notify:\n  - on: [aborted]\n", "3:5", "takes `webhook` (a URL) or `command`"),
    ("notify:\n  - webhook: http://h/x\n    command: echo\n", "4:5", "not both"),
    ("notify:\n  - webhook: ftp://h/x\n", "3:14", "not an http:// or https:// URL with a host: got 'ftp://h/x'"),
    ("notify:\n  - webhook: http://h/x\n    on: [aborted, endd]\n", "4:19", "'endd' is no event"),
    ("notify:\n  - webhook: http://h/x\n    on: []\n", "4:9", "on is empty"),
    ("notify:\n  - webhook: http://h/x\n    format: xml\n", "4:13", "json | slack, got 'xml'"),
    ("notify:\n  - command: echo\n    format: slack\n", "4:5", "`format` is for a webhook"),
    ("notify:\n  - webhook: {from_env: NOT_SET_HERE}\n", "3:25", "'NOT_SET_HERE' is not set"),
    ("notify:\n  - webhook: {value: http://h/x, from_env: A}\n", "3:14", "one of them"),
    ("notify:\n  - webhook: http://[::1/x\n", "3:14", "not an http:// or https:// URL with a host"),
    ("notify:\n  - command: \"true #" + "x" * 140_000 + "\"\n", "3:14", "more than 65536: bash gets it as one"),
])
def test_a_bad_channel_is_one_message_at_its_line(tmp_path: Path, text: str, where: str, said: str) -> None:
    message = playbook_error(write_playbook(tmp_path, HEAD, text))
    assert message.startswith(where + ":"), message
    assert said in message, message


def test_a_secret_url_that_is_not_a_url_is_refused_without_showing_it(tmp_path: Path) -> None:
    path = write_playbook(tmp_path, HEAD, "notify:\n  - webhook: {from_env: HOOK_URL}\n")
    with pytest.raises(Exception) as info:
        load_playbook(path, environ={"HOOK_URL": "not-a-url-s3cr3t"})
    assert "is not an http:// or https:// URL" in str(info.value) and "s3cr3t" not in str(info.value)


def run_dir(tmp_path: Path, abort: dict | None = None, exit_code: str | None = None) -> Path:
    d = tmp_path / "20261203-101500-abcdef"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"target": "ct200", "playbook": "dflash"}))
    if abort is not None:
        (d / "abort.json").write_text(json.dumps(abort))
    if exit_code is not None:
        (d / "exit_code").write_text(exit_code)
    return d


FX = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function"


def test_an_aborted_and_an_ended_payload_validate_and_say_what_happened_where_and_what_to_do(tmp_path: Path) -> None:
    d = run_dir(tmp_path, abort={"reason": "match", "rule": "fx-tracing-race", "by": "watchdog",
                                 "excerpt": "Traceback (most recent call last):\n" + FX}, exit_code="130\n")
    cfg = parse({"restart": None})
    aborted = payload.build(str(d), cfg, "aborted", {"reason": "match", "rule": "fx-tracing-race"})
    validate(aborted)
    assert (aborted["what"], aborted["outcome"], aborted["exit_code"], aborted["rule"]) == (
        "aborted", "aborted", 7, "fx-tracing-race")
    assert aborted["run"] == d.name and aborted["target"] == "ct200" and FX in aborted["excerpt"]
    line = aborted["text"]
    assert "\n" not in line and d.name in line and "ct200" in line and "fx-tracing-race" in line and FX in line
    assert f"gpuops logs --run {d.name} -t ct200" in line
    stacks = [{"pid": 4242, "file": "stacks/4242.txt", "threads": 3, "via": "faulthandler"}]
    (d / "abort-done.json").write_text(json.dumps({"stacks": stacks, "survivors": []}))
    ended = payload.build(str(d), cfg, "ended", {})
    validate(ended)
    assert (ended["outcome"], ended["exit_code"], ended["command_exit_code"]) == ("aborted", 7, 130)
    assert ended["stacks"] == stacks  # where the threads' stacks taken before the kill are kept
    assert "exit 7" in ended["text"]


def test_a_success_a_warning_a_stall_and_a_test_validate(tmp_path: Path) -> None:
    d = run_dir(tmp_path, exit_code="0\n")
    ok = payload.build(str(d), parse({}), "ended", {})
    assert (ok["outcome"], ok["exit_code"], ok["rule"]) == ("succeeded", 0, None) and "SUCCEEDED" in ok["text"]
    warned = payload.build(str(d), parse({}), "warned", {"rule": "loss-nan", "action": "warn", "excerpt": "loss nan"})
    stalled = payload.build(str(d), parse({}), "stalled", {"seconds": 900})
    for obj in (ok, warned, stalled, payload.test_payload("notify-test-abc123", "ct200", "dflash")):
        validate(obj)
    assert payload.what_of("match", {"action": "abort"}) is None and payload.what_of("match", {"action": "warn"})
    assert payload.key_of("warned", 2, "loss nan/x") == "warned-2-loss_nan_x"


def test_one_post_reaches_the_hook_and_says_its_status() -> None:
    with Hook(200) as hook:
        answer = webhook.post(hook.url, b'{"a": 1}', Masker([]))
        assert answer == {"ok": True, "status": 200}
        assert hook.got == [{"a": 1}]


@pytest.mark.parametrize(("status", "retry"), [(500, True), (429, True), (404, False)])
def test_an_http_error_says_its_status_and_whether_it_is_worth_another_try(status: int, retry: bool) -> None:
    with Hook(status) as hook:
        answer = webhook.post(hook.url, b"{}", Masker([]))
    assert (answer["ok"], answer["status"], answer["retry"]) == (False, status, retry)


def test_a_hook_that_never_answers_costs_one_timeout_and_the_reason_hides_a_secret_url() -> None:
    with Hook(None, path="/T0/B0/s3cr3t-path") as hook:
        started = time.monotonic()
        answer = webhook.post(hook.url, b"{}", Masker([hook.url]), timeout=0.5)
        assert hook.open == 1  # the connection is still held: the try gave up on its own timeout
        assert time.monotonic() - started < 5
    assert not answer["ok"] and answer["retry"] and "no answer within 0.5s" in answer["reason"]
    bad = webhook.post("http://127.0.0.1:1/s3cr3t-path", b"{}", Masker(["http://127.0.0.1:1/s3cr3t-path"]))
    assert "s3cr3t" not in bad["reason"] and "cannot reach the hook" in bad["reason"]


def test_retries_back_off_and_stop_at_a_final_answer() -> None:
    slept: list[float] = []
    with Hook(503) as hook:
        answer = deliver.with_retries(channel({"webhook": hook.url}), {"text": "t"}, since=time.time(), folder="/",
                                      payload_file="", output="", mask=Masker([]), retry_for=20.0, sleep=slept.append)
        assert len(hook.got) == answer["tries"] == len(slept) + 1 and slept[:3] == [1.0, 2.0, 5.0]
    assert not answer["ok"] and "tried" in answer["reason"]
    with Hook(404) as hook:
        answer = deliver.with_retries(channel({"webhook": hook.url, "format": "slack"}), {"text": "a line"},
                                      since=time.time(), folder="/", payload_file="", output="", mask=Masker([]), sleep=slept.append)
        assert answer["tries"] == 1 and hook.got == [{"text": "a line"}]  # slack: {"text": ...} only


def test_a_redirect_is_a_failure_with_its_status_and_the_payload_never_goes_out_as_a_get() -> None:
    with Hook(redirect="/elsewhere") as hook:
        answer = webhook.post(hook.url, b'{"what": "aborted"}', Masker([]))
        assert hook.gets == []  # followed, the POST would have become a GET answered 200
    assert (answer["ok"], answer["status"], answer["retry"]) == (False, 302, False), answer
    assert "never follows a redirect" in answer["reason"]


def test_a_hook_that_trickles_its_answer_fails_within_the_try_limit_and_within_the_retry_window() -> None:
    with Hook(trickle=True) as hook:
        done: list[dict] = []
        worker = threading.Thread(target=lambda: done.append(deliver.with_retries(
            channel({"webhook": hook.url}), {"text": "t"}, since=time.time(), folder="/", payload_file="", output="",
            mask=Masker([]), retry_for=3.0, sleep=lambda _s: None)), daemon=True)
        worker.start()
        worker.join(20)  # one byte a second of a 1000-byte answer: 17 minutes, were each read alone bounded
        assert done, "the delivery still waits on a trickling hook"
    (answer,) = done
    assert not answer["ok"] and answer["status"] == 200 and "did not end within" in answer["reason"], answer


def test_every_part_of_a_secret_url_is_masked_in_every_form() -> None:
    url = "https://us%40er:p%40ss-w0rd@hooks.example.org:8443/services/T0/s3cr3t%2Ftok?token=abcdef123#frag"
    mask = Masker([url])
    for said in ("nonnumeric port: 'p@ss-w0rd@hooks.example.org'", "p%40ss-w0rd", "/services/T0/s3cr3t/tok",
                 "'/services/T0/s3cr3t%2Ftok?token=abcdef123' (found at least ' ')", "token=abcdef123",
                 "%2Fservices%2FT0%2Fs3cr3t%252Ftok", "abcdef123", "us%40er:p%40ss-w0rd"):
        shown = mask(said)
        assert "w0rd" not in shown and "s3cr3t" not in shown and "abcdef123" not in shown, (said, shown)
    assert mask("the hook at /hook answered") == "the hook at /hook answered"  # short parts of no secret stay


def test_a_url_with_credentials_is_delivered_with_basic_auth_and_a_path_with_a_space_quoted() -> None:
    with Hook(path="/s3cr3t tok") as hook:
        url = f"http://user:pa55word@127.0.0.1:{hook.port}/s3cr3t tok"
        answer = webhook.post(url, b"{}", Masker([url]))
        assert answer == {"ok": True, "status": 200}, answer
        assert hook.paths == ["/s3cr3t%20tok"]
        assert hook.auth == ["Basic " + base64.b64encode(b"user:pa55word").decode()]
    refused = webhook.post("http://user:pa55word@127.0.0.1:1/x", b"{}", Masker(["http://user:pa55word@127.0.0.1:1/x"]))
    assert not refused["ok"] and "pa55word" not in refused["reason"] and "cannot reach the hook" in refused["reason"]


def test_a_hooks_reason_phrase_is_kept_with_its_control_characters_escaped() -> None:
    with Hook(500, phrase="\x1b]0;owned\x07\x1b[2J\x9bBoom") as hook:
        answer = webhook.post(hook.url, b"{}", Masker([]))
    assert answer["status"] == 500 and answer["reason"].startswith("HTTP 500 "), answer
    assert "\x1b" not in answer["reason"] and "\x07" not in answer["reason"] and "\x9b" not in answer["reason"]
    assert "\\x1b]0;owned\\x07" in answer["reason"]


def test_slack_gets_a_log_lines_markup_escaped() -> None:
    line = "loss <!channel> see <https://evil.example/x|gpuops logs> & more"
    with Hook() as hook:
        deliver.with_retries(channel({"webhook": hook.url, "format": "slack"}), {"text": line}, since=time.time(),
                             folder="/", payload_file="", output="", mask=Masker([]))
        (got,) = hook.got
    assert got == {"text": "loss &lt;!channel&gt; see &lt;https://evil.example/x|gpuops logs&gt; &amp; more"}


def test_a_command_channel_gets_a_nul_as_text_and_keeps_only_its_outputs_tail(tmp_path: Path) -> None:
    out, seen = tmp_path / "out", tmp_path / "seen"
    (tmp_path / "workdir").write_text(str(tmp_path))
    command = f'printf %s "$GPUOPS_NOTIFY_TEXT" > {seen}; head -c 3000000 /dev/zero | tr "\\0" x; echo; echo END'
    answer = deliver.with_retries(channel({"command": command}), {"text": "loss \x00 nan"}, since=time.time(),
                                  folder=str(tmp_path), payload_file="", output=str(out), mask=Masker([]))
    assert answer["ok"] and seen.read_text() == "loss \\x00 nan", answer
    again = deliver.once(channel({"command": command + "; exit 3"}), {"text": "t"}, folder=str(tmp_path),
                         payload_file="", output=str(out), mask=Masker([]))
    assert again["exit"] == 3  # a second try appends, and the file still keeps the tail only
    assert out.stat().st_size == deliver.OUTPUT_LIMIT and out.read_bytes().endswith(b"x\nEND\n")


def test_one_channel_gets_a_runs_notifications_in_the_order_they_were_queued(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`stalled` is queued before `aborted` (the watchdog writes the stall first), and each has its own sender:
    the second waits for the first's answer on the channel, however slowly the hook answers it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    d = tmp_path / ".gpuops" / "runs" / "20261203-101500-abcdef"
    d.mkdir(parents=True)
    with Hook(hold={"stalled": 2.0}) as hook:
        (d / "watch.json").write_text(json.dumps({"session": "s", "notify": [{"webhook": hook.url, "on": ["stalled",
                                                                                                            "aborted"]}]}))
        outbox.folder(str(d))
        for what in ("stalled", "aborted"):
            (d / "notify" / f"{what}-1.json").write_text(json.dumps({"what": what, "text": what}))
            outbox.append(str(d), {"key": f"{what}-1", "state": "queued", "what": what, "channels": [1]})
        senders = [threading.Thread(target=sender.tool_notify, args=([d.name, f"{what}-1"],))
                   for what in ("aborted", "stalled")]  # the later one's sender starts first
        for t in senders:
            t.start()
        for t in senders:
            t.join(30)
        times = {what: (arrived, answered) for what, arrived, answered in hook.times}
    assert hook.whats() == ["stalled", "aborted"], hook.times
    assert times["aborted"][0] >= times["stalled"][1], hook.times  # sent once the stalled one was answered


def test_ended_says_why_the_restart_it_waited_for_never_ran_and_a_line_is_printable(tmp_path: Path) -> None:
    d = run_dir(tmp_path, exit_code="4\n")
    held = "the GPUs did not drain after attempt 1 ended (GPU 5 held by pids [4242])"
    (d / "attempt.json").write_text(json.dumps({"attempt": 2, "max_attempts": 3, "state": "running",
                                                "start_failed": held}))
    ended = payload.build(str(d), parse({"restart": {"max": 2}}), "ended", {})
    validate(ended)
    assert ended["restart_failed"] == "attempt 2 could not start: " + held and held in ended["text"], ended
    warned = payload.build(str(d), parse({}), "warned", {"rule": "loss-nan", "action": "warn",
                                                  "line": "loss \x00 nan\x1b]0;owned\x07"})
    assert "loss \\x00 nan\\x1b]0;owned\\x07" in warned["text"], warned["text"]


def test_a_malformed_ipv6_webhook_is_exit_2_at_its_line_in_validate_and_launch(tmp_path: Path) -> None:
    from bench.cli import REPO, gpuops

    path = write_playbook(tmp_path, HEAD, "notify:\n  - webhook: http://[::1/x\n")
    for command in ("validate", "launch"):
        result = gpuops(command, "-i", str(REPO / "inventories" / "local.yaml"), "-p", path, "-t", "local")
        assert result.code == 2, result
        assert f"{path}:3:14: notify channel 1's webhook is not an http:// or https:// URL" in result.err, result
