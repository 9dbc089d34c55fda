"""How gpuops' own words look, on real CLI runs: one error style, `-q`, and NO_COLOR honoured fully.

- Every error, click's usage errors included, is `gpuops: error: ...` then a `hint:` line (exit 2 for
  usage), never click's `Error:`.
- `gpuops -q CMD`: errors and the final outcome only on stderr; stdout (a log, --json lines) unchanged.
- NO_COLOR=1 on a terminal: no ANSI style at all (rich's own NO_COLOR support drops colours but kept bold).
"""

from __future__ import annotations

import re

from bench import LocalEnv
from bench.cli import argv, gpuops_text
from test_tty_render import LOCAL, Terminal

DEMO = ("-i", "inventories/local.yaml", "-p", "playbooks/demo.yaml")
SGR = re.compile(rb"\x1b\[[0-9;]*m")  # Select Graphic Rendition: colour, bold, underline, reset


def test_click_usage_errors_come_in_gpuops_style_with_a_usage_hint_and_exit_2() -> None:
    for args, said in ((("status", "--bogus"), "No such option '--bogus'"),
                       (("launch", "--junit", "r.xml", "--dry-run", *DEMO), "--junit does not apply to --dry-run"),
                       (("runs", "--limit", "0"), "Invalid value for '--limit'")):
        result = gpuops_text(*args)
        assert result.returncode == 2, result
        lines = result.stderr.splitlines()
        assert lines[0].startswith(f"gpuops: error: {said}"), result.stderr
        command = args[0]
        assert lines[1] == f"hint: usage: python -m gpuops {command} [OPTIONS]; see 'python -m gpuops {command} --help'"
        assert "Error:" not in result.stderr and "Usage:" not in result.stderr, result.stderr
        assert result.stdout == ""


def test_gpuops_own_errors_have_the_same_prefix() -> None:
    result = gpuops_text("validate", "-i", "/no/such/inventory.yaml")
    assert result.returncode == 2, result
    assert result.stderr.startswith("gpuops: error: /no/such/inventory.yaml"), result.stderr


def test_quiet_validate_says_nothing_when_all_is_well_and_still_the_error() -> None:
    loud = gpuops_text("validate", *DEMO)
    assert loud.returncode == 0 and loud.stdout.startswith("ok: ") and loud.stderr == "", loud  # the output: stdout
    for quiet in (gpuops_text("-q", "validate", *DEMO), gpuops_text("validate", *DEMO, "-q")):  # -q before or after
        assert (quiet.returncode, quiet.stderr, quiet.stdout) == (0, "", ""), quiet
    bad = gpuops_text("-q", "validate", "-i", "/no/such/inventory.yaml")
    assert bad.returncode == 2 and bad.stderr.startswith("gpuops: error: "), bad


def test_quiet_launch_shows_only_the_outcome_and_json_is_unchanged(local_env: LocalEnv) -> None:
    quiet = gpuops_text("-q", "launch", *DEMO, timeout=180)
    assert quiet.returncode == 7, quiet
    words = quiet.stderr.splitlines()
    assert words and words[0].startswith("gpuops: ABORTED (exit 7): "), quiet.stderr  # the outcome, first and only
    assert all(not w.startswith("[local]") for w in words), quiet.stderr  # no progress, no events
    assert "warmup" not in quiet.stderr
    as_json = gpuops_text("-q", "launch", "--json", *DEMO, timeout=180)
    assert as_json.returncode == 7 and as_json.stderr == "", as_json
    kinds = [line.split('"event": "', 1)[1].split('"', 1)[0] for line in as_json.stdout.splitlines()]
    assert {"preflight_ok", "warmup_done", "started", "match", "summary"} <= set(kinds), kinds  # every event is there


def raw_status(local_env: LocalEnv, *prefix: str) -> bytes:
    term = Terminal([*prefix, *argv("status", "-i", LOCAL)])
    assert term.finish() == 0, term.text
    return bytes(term._raw)


def test_no_color_drops_every_style_on_a_terminal(local_env: LocalEnv) -> None:
    styled = raw_status(local_env)
    assert b"\x1b[1m" in styled  # rich makes the table's header bold: the terminal sees styles
    plain = raw_status(local_env, "env", "NO_COLOR=1")
    assert not SGR.search(plain), plain[:2000]
    assert b"local" in plain  # the table is still there, in plain text


def test_a_machine_without_nvidia_smi_is_said_once_in_the_preflight_line(local_env: LocalEnv) -> None:
    """The local demo on a machine without NVIDIA tools: one calm word where the checks are, no
    `no GPU samples: nvidia-smi cannot run` in the middle of the training's output."""
    import shutil

    bindir = local_env.root / "no-smi-bin"
    bindir.mkdir()
    for tool in ("python3", "tmux", "bash", "flock"):
        (bindir / tool).symlink_to(shutil.which(tool))
    result = gpuops_text("launch", *DEMO, "-y", env={"PATH": f"{bindir}:/usr/bin:/bin"}, timeout=180)
    assert result.returncode == 7, result
    assert "[local] preflight ok; no nvidia-smi here, so no GPU telemetry\n" in result.stderr, result.stderr
    assert "nvidia-smi cannot run" not in result.stderr, result.stderr
