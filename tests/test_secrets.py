"""Secret env values show as *** everywhere gpuops speaks, and arrive intact on the target.

A value is secret when the playbook says so (`secrets: [NAME]`, `{value: ..., secret: true}`,
`{from_env: ..., secret: true}`) or its name holds TOKEN, KEY, SECRET or PASSWORD. Checked over
real sshd + pct into CT 200: `--dry-run` (text and JSON), warmup progress, `--json` events,
meta.json and abort.json in the run directory, and error messages (a failing warmup's tail).

Decided and documented (docs/security.md, Secrets): what the job itself prints is the user's output and is
shown as it is: the training log (stdout of `launch`, `log` events, `gpuops logs`) and the files
the job writes on the target (log, warmup-<gpu>.log, run.sh, which must hold the values). gpuops'
own words about that output (a matched line, the abort excerpt, the summary, abort.json) mask it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.cli import Cli, CtCli

SESSION = "sec"
# name -> (how it is declared in the playbook, its value). Values hold shell syntax and quotes too:
# they must reach the target exactly, and be masked in all their forms.
SECRETS: dict[str, tuple[Any, str]] = {
    "HF_TOKEN": ("tok-hf-1111", "tok-hf-1111"),
    "WANDB_API_KEY": ("key wandb '2222' $(id)", "key wandb '2222' $(id)"),
    "DB_PASSWORD": ('pw "3333" `id`', 'pw "3333" `id`'),
    "MY_SECRET": ("sec-my-4444;exit", "sec-my-4444;exit"),
    "ci_password": ("lower-5555", "lower-5555"),
    "LISTED": ("listed-6666", "listed-6666"),
    "FLAGGED": ({"value": "flagged-7777", "secret": True}, "flagged-7777"),
    "FROM_LAPTOP": ({"from_env": "GPUOPS_TEST_SECRET_SRC", "secret": True}, "from-env-8888"),
    "HUB_TOKEN": ({"from_env": "GPUOPS_TEST_TOKEN_SRC"}, "hub-from-env-9999"),  # secret by its name
    "PEM_KEY": ("-----BEGIN KEY-----\nAAAAinner1111\nBBBBinner2222\n-----END KEY-----",
                "-----BEGIN KEY-----\nAAAAinner1111\nBBBBinner2222\n-----END KEY-----"),
}
LAPTOP_ENV = {"GPUOPS_TEST_SECRET_SRC": "from-env-8888", "GPUOPS_TEST_TOKEN_SRC": "hub-from-env-9999"}
PLAIN = ("PLAIN_SETTING", "visible-plain-value")  # not secret: shown, so the checks below look in the right place
LEAKS = [v for _, v in SECRETS.values()] + [line for _, v in SECRETS.values() for line in v.splitlines() if len(line) >= 3]
FX_LINE = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function"


def leaks(text: str) -> list[str]:
    """The secret values (or lines of them) found in `text`."""
    return [value for value in LEAKS if value in text]


class Ct(CtCli):
    def playbook_for(self, *, warmup: str | None = None, command: str = "fake-train --mode steps --steps 3 --gpus 5") -> Path:
        env: dict[str, Any] = {name: declared for name, (declared, _) in SECRETS.items()}
        env[PLAIN[0]] = PLAIN[1]
        data: dict[str, Any] = {
            "name": "secrets",
            "env": env,
            "secrets": ["LISTED"],
            "preflight": {"gpus": [5]},
            "launch": {"session": SESSION, "command": command},
            "watch": {"stall_timeout": 60},
            "abort": {"grace": 3},
        }
        if warmup:
            data["warmup"] = {"gpus": [5], "command": warmup}
        return self.write(data)

    def run(self, *args: str) -> Cli:
        return self.gpuops("launch", *args, env=LAPTOP_ENV)

    def records(self) -> dict[str, str]:
        """gpuops' own records in the run directory."""
        return {name: (self.run_dir() / name).read_text() for name in ("meta.json", "abort.json") if (self.run_dir() / name).exists()}


# A warmup that prints every variable it got, each value framed, then the literal first secret.
ECHO_ENV = " ; ".join(f"printf '<%s>\\n' \"${name}\"" for name in [*SECRETS, PLAIN[0]])


# -- --dry-run -------------------------------------------------------------------------------------
def test_dry_run_shows_every_secret_as_stars(ct: Ct) -> None:
    # The warmup command also holds a secret literally: a value is secret wherever it is written.
    ct.playbook_for(warmup=f"fake-warmup --gpu {{gpu}} --tag {SECRETS['HF_TOKEN'][1]}")
    text = ct.run("--dry-run")
    assert text.code == 0, text
    assert leaks(text.text + text.err) == [], text
    for name in SECRETS:
        assert f"export {name}=***" in text.text, name
    assert f"export {PLAIN[0]}={PLAIN[1]}" in text.text
    assert "fake-warmup --gpu 5 --tag ***" in text.text
    as_json = ct.run("--dry-run", "--json")
    assert as_json.code == 0, as_json
    assert leaks(as_json.text + as_json.err) == [], as_json
    commands = "\n".join(e.get("command", "") + "\n" + e.get("stdin", "") for e in as_json.events())
    assert "export HF_TOKEN=***" in commands and PLAIN[1] in commands


# -- warmup progress, JSON, the run's records ------------------------------------------------------------
def test_a_warmup_that_echoes_its_env_shows_stars_and_got_the_real_values(ct: Ct) -> None:
    ct.playbook_for(warmup=ECHO_ENV)
    result = ct.run()
    assert result.code == 0, result
    assert leaks(result.text + result.err) == [], result
    progress = [line for line in result.err.splitlines() if line.startswith("[ct200 warmup gpu5] ")]
    assert "[ct200 warmup gpu5] <tok-hf-1111>" not in progress
    assert progress.count("[ct200 warmup gpu5] <***>") == len(SECRETS) - 1, progress  # the PEM key spans 4 lines
    assert f"[ct200 warmup gpu5] <{PLAIN[1]}>" in progress
    # On the target the warmup got every value exactly (quotes, $( ), backticks, newlines).
    printed = (ct.run_dir() / "warmup-5.log").read_text()
    assert printed == "".join(f"<{value}>\n" for _, value in SECRETS.values()) + f"<{PLAIN[1]}>\n"
    meta = json.loads(ct.records()["meta.json"])
    assert meta["env"] == {**dict.fromkeys(SECRETS, "***"), PLAIN[0]: PLAIN[1]}
    assert leaks(ct.records()["meta.json"]) == []


def test_json_events_and_run_records_hold_no_secret(ct: Ct) -> None:
    ct.playbook_for(warmup=ECHO_ENV)
    result = ct.run("--json")
    assert result.code == 0, result
    events = result.events()
    assert leaks(result.text + result.err) == [], result
    lines = [e["line"] for e in events if e["event"] == "warmup_output"]
    assert "<***>" in lines and f"<{PLAIN[1]}>" in lines
    assert events[-1]["event"] == "summary" and events[-1]["exit_code"] == 0
    assert leaks("".join(ct.records().values())) == []


# -- error messages ------------------------------------------------------------------------------------
def test_a_failing_warmup_that_prints_a_secret_is_reported_masked(ct: Ct) -> None:
    ct.playbook_for(warmup=f'{ECHO_ENV}; echo "login failed for $HF_TOKEN" >&2; exit 3')
    result = ct.run()
    assert result.code == 5, result
    assert leaks(result.err + result.text) == [], result
    assert "gpuops: error: ct200: warmup on GPU 5 exited with code 3" in result.err
    assert "    | login failed for ***" in result.err, result
    as_json = ct.run("--json")
    assert as_json.code == 5, as_json
    summary = as_json.events()[-1]
    assert summary["exit_code"] == 5 and "login failed for ***" in summary["output_tail"], summary
    assert leaks(as_json.text + as_json.err) == [], as_json
    assert leaks(ct.records()["meta.json"]) == []


def test_a_failed_run_quotes_its_last_log_line_masked(ct: Ct) -> None:
    ct.playbook_for(command='echo "cannot log in with $HF_TOKEN"; exit 4')
    result = ct.run()
    assert result.code == 6, result
    assert "training exited with code 4; last log line: cannot log in with ***" in result.err, result
    assert leaks(result.err) == []
    assert result.text == "cannot log in with tok-hf-1111\n"  # the log itself: the user's output, as it is


# -- the training log --------------------------------------------------------------------------------
TRACE_WITH_SECRET = (
    'printf "step 1/100 loss 2.0\\n"; '
    'printf "Traceback (most recent call last):\\n"; '
    'printf "  File \\"/root/train.py\\", line 9, in <module>\\n"; '
    'printf "    hub.login(\\"%s\\")\\n" "$HF_TOKEN"; '
    f'printf "{FX_LINE}\\n"; sleep 600'
)


def test_a_log_that_prints_a_secret_is_shown_as_is_but_the_abort_masks_it(ct: Ct) -> None:
    ct.playbook_for(command=TRACE_WITH_SECRET)
    result = ct.run()
    assert result.code == 7, result
    # The log is the user's own output: streamed as it is.
    assert 'hub.login("tok-hf-1111")' in result.text
    # gpuops' words about it (match line, excerpt, outcome) and its abort record mask the secret.
    assert leaks(result.err) == [], result
    assert re.search(r'    \|\s+hub\.login\("\*\*\*"\)', result.err), result
    record = ct.records()["abort.json"]
    assert 'hub.login(\\"***\\")' in record and leaks(record) == []
    # `gpuops logs` prints the log's bytes as they are.
    logs = ct.gpuops("logs")  # another machine: without the launcher's from_env variables
    assert logs.code == 0 and 'hub.login("tok-hf-1111")' in logs.text, logs


def test_a_log_that_prints_a_secret_in_json(ct: Ct) -> None:
    ct.playbook_for(command=TRACE_WITH_SECRET)
    result = ct.run("--json")
    assert result.code == 7, result
    events = result.events()
    logged = [e for e in events if e["event"] == "log"]
    assert any('hub.login("tok-hf-1111")' in e["line"] for e in logged)  # log events: the log as it is
    others = json.dumps([e for e in events if e["event"] != "log"])
    assert leaks(others) == [], others
    summary = events[-1]
    assert summary["outcome"] == "aborted" and 'hub.login("***")' in summary["excerpt"], summary


def test_another_machine_attaches_without_the_launchers_from_env_secrets(ct: Ct) -> None:
    # CI launches with the secrets in its environment; a laptop without them looks, follows and stops.
    ct.playbook_for(command="fake-train --mode steps --steps 100000 --gpus 5 --interval 0.1")
    started = ct.run("--detach")
    assert started.code == 0, started
    status = ct.gpuops("status")
    assert status.code == 0 and f"session {SESSION} alive" in status.text, status
    logs = ct.gpuops("logs", "--tail", "2")
    assert logs.code == 0 and logs.text.startswith("step "), logs
    stopped = ct.gpuops("stop")
    assert stopped.code == 0, stopped
    assert leaks(status.text + logs.text + logs.err + stopped.err) == []
    assert not ct.session_alive()
