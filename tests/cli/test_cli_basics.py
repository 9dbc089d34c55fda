"""The CLI as a user meets it: bad files, unknown targets, the shipped files, env vars, help, crashes.

Every test drives `python -m gpuops` (or click's runner for the crash boundary) and checks what a
user sees: the exit code, the one-line message on stderr, JSON on stdout. Nothing here connects
to inventories/example.yaml's host: that file is only validated and dry-run.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from bench import SshServer, write_inventory
from bench.cli import gpuops_text
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_INV = REPO / "inventories" / "example.yaml"
LOCAL_INV = REPO / "inventories" / "local.yaml"
DFLASH = REPO / "playbooks" / "dflash.yaml"
DEMO = REPO / "playbooks" / "demo.yaml"
ERROR_LINE = re.compile(r"^gpuops: error: (?P<where>.+?):(?P<line>\d+):(?P<col>\d+): (?P<what>.+)$")


def gpuops(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would; the developer's own GPUOPS_* variables never leak in."""
    return gpuops_text(*args, env=env, timeout=timeout)


def assert_config_error(result: subprocess.CompletedProcess[str], path: Path, line: int, col: int, what: str) -> None:
    """Exit 2, one `gpuops: error: FILE:LINE:COL: ...` line first on stderr, no traceback, stdout empty."""
    assert result.returncode == 2, result
    first = result.stderr.splitlines()[0]
    m = ERROR_LINE.match(first)
    assert m, first
    assert (m["where"], int(m["line"]), int(m["col"])) == (str(path), line, col), first
    assert what in m["what"], first
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


# -- malformed files ---------------------------------------------------------------------------

BAD_INDENT = "hosts:\n  pve1:\n    address: 10.0.0.1\n   user: root\ntargets:\n  t: {host: pve1}\n"
UNKNOWN_KEY = "hosts:\n  pve1:\n    address: 10.0.0.1\n    usr: root\ntargets:\n  t: {host: pve1}\n"
BAD_PORT = "hosts:\n  pve1:\n    address: 10.0.0.1\n    port: twenty-two\ntargets:\n  t: {host: pve1}\n"


@pytest.mark.parametrize(
    "text, line, col, what",
    [
        (BAD_INDENT, 4, 4, "did not find expected key"),
        (UNKNOWN_KEY, 4, 5, "did you mean 'user'?"),
        (BAD_PORT, 4, 11, "expected a port number"),
    ],
    ids=["yaml-syntax", "unknown-key", "bad-value"],
)
@pytest.mark.parametrize("command", ["validate", "status", "launch", "logs", "stop"])
def test_a_malformed_inventory_names_file_line_and_column(
    tmp_path: Path, command: str, text: str, line: int, col: int, what: str
) -> None:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(text)
    result = gpuops(command, "-i", str(inv), "-p", str(DFLASH))
    assert_config_error(result, inv, line, col, what)


def test_a_malformed_playbook_names_file_line_and_column(tmp_path: Path) -> None:
    pb = tmp_path / "train.yaml"
    pb.write_text("name: x\nlaunch:\n  session: s\n  command: c\nwatch:\n  stall_timeout: soon\n")
    result = gpuops("validate", "-i", str(EXAMPLE_INV), "-p", str(pb))
    assert_config_error(result, pb, 6, 18, "expected a number of seconds >= 0, got 'soon'")


def test_a_malformed_file_with_json_is_one_summary_object(tmp_path: Path) -> None:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(BAD_INDENT)
    result = gpuops("status", "--json", "-i", str(inv))
    assert result.returncode == 2
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    summary = json.loads(lines[0])
    assert summary["event"] == "summary" and summary["exit_code"] == 2
    assert summary["error"].startswith(f"{inv}:4:4: ")
    assert "Traceback" not in result.stderr


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = gpuops("validate", "-i", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"gpuops: error: {tmp_path / 'nope.yaml'}: no such file")
    assert "Traceback" not in result.stderr


# -- targets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["launch", "--dry-run"], ["logs"], ["stop"], ["validate"]])
def test_an_unknown_target_exits_2_and_lists_the_known_ones(command: list[str]) -> None:
    result = gpuops(*command, "-i", str(EXAMPLE_INV), "-p", str(DFLASH), "-t", "ct999")
    assert result.returncode == 2, result
    assert "unknown target 'ct999'" in result.stderr
    assert "ct200" in result.stderr  # the targets that do exist
    assert "Traceback" not in result.stderr


def test_a_playbook_whose_target_is_not_in_the_inventory_is_caught_by_validate() -> None:
    result = gpuops("validate", "-i", str(EXAMPLE_INV), "-p", str(DEMO))
    assert result.returncode == 2
    m = ERROR_LINE.match(result.stderr.splitlines()[0])
    assert m and m["where"] == str(DEMO) and "unknown target 'local'" in m["what"], result.stderr


# -- the shipped files -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "inventory, playbook, target",
    [(EXAMPLE_INV, DFLASH, "ct200"), (LOCAL_INV, DEMO, "local")],
    ids=["example+dflash", "local+demo"],
)
def test_the_shipped_files_validate(inventory: Path, playbook: Path, target: str) -> None:
    result = gpuops("validate", "-i", str(inventory), "-p", str(playbook))
    assert result.returncode == 0, result.stderr
    assert f"target '{target}' found" in result.stdout  # what was checked is the output
    assert result.stderr == ""
    as_json = gpuops("validate", "--json", "-i", str(inventory), "-p", str(playbook))
    assert as_json.returncode == 0
    summary = json.loads(as_json.stdout)
    assert summary["outcome"] == "valid" and summary["exit_code"] == 0
    assert summary["event"] == "summary" and summary["target"] == target and summary["ts"].endswith("Z")
    assert len(summary["checked"]) == 3


def test_validate_checks_the_file_and_notes_from_env_variables_unset_here(tmp_path: Path) -> None:
    # A CI lint has the playbook but not the secrets: the file is valid, launch is what needs them.
    pb = tmp_path / "pb.yaml"
    pb.write_text("name: x\ntarget: local\nlaunch: {session: x, command: 'true'}\n"
                  "env:\n  HUB_TOKEN: {from_env: GPUOPS_TEST_HUB}\n  USER_NAME: {from_env: GPUOPS_TEST_ME}\n")
    lint = gpuops("validate", "-i", str(LOCAL_INV), "-p", str(pb), env={"GPUOPS_TEST_ME": "ann"})
    assert lint.returncode == 0, lint.stderr
    notes = [line for line in lint.stderr.splitlines() if line.startswith("note: ")]
    assert notes == ["note: GPUOPS_TEST_HUB is not set here; the playbook's env reads it (from_env), so launch will need it"]
    as_json = gpuops("validate", "--json", "-p", str(pb), env={"GPUOPS_TEST_ME": "ann"})
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["unset_env"] == ["GPUOPS_TEST_HUB"]
    both = gpuops("validate", "--json", "-p", str(pb), env={"GPUOPS_TEST_ME": "ann", "GPUOPS_TEST_HUB": "t"})
    assert json.loads(both.stdout)["unset_env"] == []
    launch = gpuops("launch", "--dry-run", "-i", str(LOCAL_INV), "-p", str(pb), env={"GPUOPS_TEST_ME": "ann"})
    assert launch.returncode == 2
    assert "environment variable 'GPUOPS_TEST_HUB' is not set (env 'HUB_TOKEN' reads it with from_env)" in launch.stderr


def test_validate_with_nothing_to_check_is_a_usage_error() -> None:
    result = gpuops("validate")
    assert result.returncode == 2
    assert "nothing to validate" in result.stderr


# -- environment variables ---------------------------------------------------------------------


def _two_target_inventory(tmp_path: Path) -> Path:
    """example.yaml plus a second container on the same host (still only dry-run)."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text(EXAMPLE_INV.read_text() + "  ct201:\n    host: pve1\n    ctid: 201\n    gpus: [5, 6, 7]\n")
    return inv


def test_env_vars_stand_in_for_inventory_and_playbook() -> None:
    result = gpuops("validate", env={"GPUOPS_INVENTORY": str(EXAMPLE_INV), "GPUOPS_PLAYBOOK": str(DFLASH)})
    assert result.returncode == 0, result.stderr
    assert f"ok: {EXAMPLE_INV}: 2 host(s), 1 target(s)" in result.stdout
    assert f"ok: {DFLASH}: playbook 'dflash-drafter'" in result.stdout


def test_env_target_picks_the_target_and_the_option_wins_over_it(tmp_path: Path) -> None:
    env = {"GPUOPS_INVENTORY": str(_two_target_inventory(tmp_path)), "GPUOPS_PLAYBOOK": str(DFLASH)}
    default = gpuops("launch", "--dry-run", env=env)
    assert default.returncode == 0, default.stderr
    assert "pct exec 200 --" in default.stdout and "pct exec 201" not in default.stdout
    by_env = gpuops("launch", "--dry-run", env={**env, "GPUOPS_TARGET": "ct201"})
    assert by_env.returncode == 0, by_env.stderr
    assert "pct exec 201 --" in by_env.stdout and "pct exec 200" not in by_env.stdout
    by_option = gpuops("launch", "--dry-run", "-t", "ct200", env={**env, "GPUOPS_TARGET": "ct201"})
    assert "pct exec 200 --" in by_option.stdout and "pct exec 201" not in by_option.stdout
    unknown = gpuops("launch", "--dry-run", env={**env, "GPUOPS_TARGET": "ct999"})
    assert unknown.returncode == 2 and "unknown target 'ct999'" in unknown.stderr


def test_env_target_selects_the_status_target(tmp_path: Path, sshd: SshServer) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd, ctid=None, target="hostonly",
                          extra_targets={"ghost": {"host": "pve1", "ctid": 4242}})  # fmt: skip
    result = gpuops("status", env={"GPUOPS_INVENTORY": str(inv), "GPUOPS_TARGET": "ghost"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["ghost: reachable via pve1, container 4242 missing"]


def test_without_an_inventory_the_message_names_the_option_and_the_variable() -> None:
    result = gpuops("status")
    assert result.returncode == 2
    assert "pass --inventory PATH or set GPUOPS_INVENTORY" in result.stderr


def test_a_bad_retry_budget_in_the_environment_is_a_usage_error(tmp_path: Path, sshd: SshServer) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    result = gpuops("status", "-i", str(inv), env={"GPUOPS_CONNECT_RETRY_TIME": "soon"})
    assert result.returncode == 2
    assert "GPUOPS_CONNECT_RETRY_TIME='soon'" in result.stderr
    assert sshd.connection_count() == 0


# -- options and help --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, options",
    [
        ("launch", ["--detach", "--dry-run", "--timeout", "--yes", "--json", "--inventory", "--playbook", "--target"]),
        ("status", ["--watch", "--json", "--inventory", "--target"]),
        ("logs", ["--follow", "--tail", "--no-abort", "--timeout", "--json"]),
        ("stop", ["--json", "--inventory", "--playbook", "--target"]),
        ("validate", ["--inventory", "--playbook", "--json"]),
    ],
)
def test_help_of_each_command(command: str, options: list[str]) -> None:
    for flag in ("--help", "-h"):
        result = gpuops(command, flag)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"Usage: python -m gpuops {command} [OPTIONS]")
        for option in options:
            assert option in result.stdout, option


def test_top_level_help_lists_the_commands_and_exit_codes() -> None:
    result = gpuops("--help")
    assert result.returncode == 0
    for command in ("launch", "status", "logs", "stop", "validate"):
        assert re.search(rf"^\s+{command}\s", result.stdout, re.M), command
    assert "3 connect/host key" in result.stdout and "7 aborted by a rule" in result.stdout
    version = gpuops("--version")
    assert version.returncode == 0 and re.fullmatch(r"gpuops, version \S+\n", version.stdout)


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--watch", "often"],
        ["launch", "--timeout", "-5"],
        ["logs", "--tail", "-1"],
        ["status", "--no-such-option"],
        ["no-such-command"],
    ],
)
def test_a_bad_option_is_a_usage_error(args: list[str]) -> None:
    result = gpuops(*args, "-i", str(EXAMPLE_INV))
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


# -- the crash boundary ------------------------------------------------------------------------


def test_an_unexpected_exception_writes_a_crash_file_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the core (injected: the status prober raises) is exit 1 with the traceback in a file that only its
    user can read (argv and the traceback may say more than others should see): 0600 in a 0700 folder of theirs."""
    import gpuops.client.status
    from gpuops.cli.main import main

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("injected bug in the core")

    monkeypatch.setattr(gpuops.client.status, "probe_target", broken)  # what status calls per target
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = CliRunner().invoke(main, ["status", "-i", str(LOCAL_INV)])
    assert result.exit_code == 1
    assert "internal error: ZeroDivisionError: injected bug in the core" in result.stderr
    m = re.search(r"the traceback is in (\S+?);", result.stderr)
    assert m, result.stderr
    crash = Path(m[1])
    assert crash.parent == tmp_path / f"gpuops-{os.getuid()}" / "crash" and crash.is_file()
    assert stat.S_IMODE(crash.stat().st_mode) == 0o600 and stat.S_IMODE(crash.parent.stat().st_mode) == 0o700
    text = crash.read_text()
    assert "Traceback (most recent call last)" in text and "injected bug in the core" in text
    assert "Traceback" not in result.stderr


def test_a_one_target_inventory_needs_no_t(local_env, tmp_path: Path) -> None:
    """A playbook without `target:` and an inventory of one target: logs and stop act on that target."""
    pb = tmp_path / "pb.yaml"
    pb.write_text("launch: {session: only-one, command: 'true'}\n")
    stopped = gpuops("stop", "-i", str(LOCAL_INV), "-p", str(pb))
    assert stopped.returncode == 0 and "no run of 'only-one' is alive on local" in stopped.stderr, stopped.stderr
    logs = gpuops("logs", "-i", str(LOCAL_INV), "-p", str(pb))
    assert logs.returncode == 2 and "no target given" not in logs.stderr and "only-one" in logs.stderr, logs.stderr
