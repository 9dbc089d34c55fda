"""The fault matrix's rows for issue 35 items 4, 5, 9 and 11's webhook URL (records gpuops does not know,
hostile hooks, hostile log lines in a channel, bad notify: values): each reuses its test's scenario
(tests/agent/test_notify.py, tests/agent/test_notify_units.py, tests/agent/test_restart.py), on a fresh real-sshd bench
through faults_agent.on_bench where it needs a target, against a real HTTP server on 127.0.0.1 where
it needs a hook, so the matrix and the suite cannot drift apart."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable, List, Tuple

import pytest
import test_notify as tn  # tests/ and its areas are on sys.path through benchkit
import test_notify_units as tu
import test_restart as tr
from bench.playbooks import playbook_error, write_playbook
from faults_agent import on_bench
from faults_restart import scenario

Result = Tuple[str, bool]


def in_process(test: Callable[..., None], said: str, *, folder: bool = False, home: bool = False) -> Callable[[], Result]:
    """A row of an in-process test (given a fresh folder, and a HOME there, where it asks for them)."""

    def row() -> Result:
        tmp = Path(tempfile.mkdtemp(prefix="gpuops-fault-"))
        try:
            with pytest.MonkeyPatch.context() as mp:
                args = ([tmp] if folder or home else []) + ([mp] if home else [])
                test(*args)
            return said, True
        except AssertionError as exc:
            return "NOT SURVIVED: " + (str(exc).splitlines() or [type(exc).__name__])[0][:160], False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return row


def long_command(tmp: Path) -> None:
    message = playbook_error(write_playbook(tmp, tu.HEAD, 'notify:\n  - command: "true #' + "x" * 140_000 + '"\n'))
    assert message.startswith("3:14:") and "more than 65536" in message, message[:200]


NOTIFY_FAULTS: List[Tuple[str, Callable[[], Result]]] = [
    ("35.4 a newer agent's events (what, kind) in a run's record", on_bench(scenario(
        tn.test_an_event_this_gpuops_does_not_know_leaves_logs_with_the_runs_exit_code,
        "logs exit 0, logs -f exit 7 (the run's), 'written by a newer gpuops' once; --json: 3 unknown_event lines, "
        "all valid"))),
    ("35.5 notify-test: a redirecting, a trickling, a hostile-phrase hook, a password URL", on_bench(scenario(
        tn.test_notify_test_reports_a_redirect_a_trickle_and_a_hostile_phrase_as_failures_and_shows_no_password,
        "exit 9 within a minute: 'HTTP 302 ... redirects' (no GET), 'did not end within 10s', the phrase as \\x1b...; "
        "Basic auth delivered; the password and path token in no output"))),
    ("35.5 notify-test killed (SIGKILL) mid-try", on_bench(scenario(
        tn.test_notify_test_killed_leaves_nothing_of_it_on_the_target,
        "its stdin's end ended the agent and its 25 s command on the target within 8 s"))),
    ("35.5 a trickling hook and the 5-minute bound", in_process(
        tu.test_a_hook_that_trickles_its_answer_fails_within_the_try_limit_and_within_the_retry_window,
        "a 1 byte/s answer: notify_failed 'HTTP 200 but the answer did not end' within the (3 s) retry window")),
    ("35.5 a secret URL's parts quoted by urllib", in_process(
        tu.test_every_part_of_a_secret_url_is_masked_in_every_form,
        "password, path, query value, as written, %-decoded and %-encoded: all ***")),
    ("35.5 a stop in the restart delay", on_bench(scenario(
        tr.test_stop_during_the_restart_delay_ends_the_run_for_good,
        "hook told aborted, ended ('attempt 2 never started: ... stopped by gpuops stop'); no restarted"))),
    ("35.5 stalled and aborted on one slow channel", in_process(
        tu.test_one_channel_gets_a_runs_notifications_in_the_order_they_were_queued,
        "stalled held 2 s by the hook: aborted sent only after its answer", home=True)),
    ("35.9 Slack markup in the matched line", in_process(
        tu.test_slack_gets_a_log_lines_markup_escaped, "<!channel> and <url|label> sent as &lt;...&gt;")),
    ("35.9 a NUL in the line and 3 MB of command output", in_process(
        tu.test_a_command_channel_gets_a_nul_as_text_and_keeps_only_its_outputs_tail,
        "delivered with \\x00 in GPUOPS_NOTIFY_TEXT; output file 64 KiB (its tail) over two tries", folder=True)),
    ("35.11 url a malformed IPv6 webhook URL", in_process(
        tu.test_a_malformed_ipv6_webhook_is_exit_2_at_its_line_in_validate_and_launch,
        "validate and launch: exit 2 at 3:14", folder=True)),
    ("35.11 url a 140 KB notify command", in_process(long_command, "refused at 3:14 (at most 64 KiB)", folder=True)),
]
