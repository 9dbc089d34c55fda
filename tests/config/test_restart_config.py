"""config/restart.py: the playbook's `restart:` section loads, is carried to the watchdog in watch.json,
and each bad value gets one FILE:LINE:COL message (exit 2 through validate)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.cli import gpuops
from bench.playbooks import playbook_error, write_playbook

from gpuops.config import load_playbook
from gpuops.config.playbook_model import Restart

HEAD = "launch: {session: s, command: c}\nwatch: {rules: [{name: loss-nan, pattern: 'loss nan'}]}\n"


def write(tmp_path: Path, text: str) -> str:
    return write_playbook(tmp_path, HEAD, text)


def error(tmp_path: Path, text: str) -> str:
    return playbook_error(write(tmp_path, text))


def test_no_section_means_no_restarts(tmp_path: Path) -> None:
    assert load_playbook(write(tmp_path, ""), environ={}).restart is None


def test_the_contracts_example_loads(tmp_path: Path) -> None:
    pb = load_playbook(write(tmp_path, """\
        restart:
          max: 2
          on: [fx-tracing-race, fx-patcher-race, stall, failed, loss-nan, throughput-drop]
          compile_guard: true
          delay: 10
          warmup: false
        """), environ={})
    assert pb.restart == Restart(max=2, on=("fx-tracing-race", "fx-patcher-race", "stall", "failed", "loss-nan",
                                            "throughput-drop"), compile_guard=True, delay=10.0, warmup=False)


def test_compile_guard_defaults_to_launchs_in_watch_json(tmp_path: Path) -> None:
    from gpuops.agent.wire.watchfile import compose, parse
    from gpuops.client.runspec import plain, restart_config

    class Play:  # restart_config reads only the playbook
        playbook = load_playbook(write(tmp_path, "restart: {max: 1, on: [stall]}\n"), environ={})

    assert compose(parse({"restart": plain(restart_config(Play()))}))["restart"] == {
        "max": 1, "on": ["stall"], "compile_guard": False, "delay": 10.0, "warmup": False, "warmup_spec": None}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("restart: {max: 11}\n", "3:16: expected the number of restarts after the first attempt (an integer 0..10), got 11"),
        ("restart: {max: -1}\n", "3:16: expected the number of restarts after the first attempt (an integer 0..10)"),
        ("restart: {on: [fx-tracing-rase]}\n", "3:16: restart.on: 'fx-tracing-rase' is no rule this playbook runs"),
        ("restart: {on: [stall, stall]}\n", "3:23: restart.on lists 'stall' twice"),
        ("restart: {on: stall}\n", "3:15: expected a list of rule names"),
        ("restart: {delay: -1}\n", "3:18: expected a number of seconds >= 0"),
        # Issue 35 item 11: 1e300 passed, and the run then held its GPUs "between attempts" for ever.
        ("restart: {max: 1, on: [stall], delay: 1e300}\n",
         "3:39: expected a number of seconds 0..3600 (the run keeps its GPUs while it waits to restart), got 1e300"),
        ("restart: {compile_guard: yes}\n", "3:26: expected true or false"),
        ("restart: {tries: 2}\n", "3:11: "),
    ],
)
def test_bad_values(tmp_path: Path, text: str, message: str) -> None:
    assert error(tmp_path, text).startswith(message), error(tmp_path, text)


def test_an_unknown_rule_name_suggests_the_close_one(tmp_path: Path) -> None:
    assert "did you mean 'fx-tracing-race'?" in error(tmp_path, "restart: {on: [fx-tracing-rase]}\n")


def test_a_bad_restart_section_exits_2_through_validate(tmp_path: Path) -> None:
    path = write(tmp_path, "restart:\n  on: [nope]\n")
    result = gpuops("validate", "-p", path)
    assert result.code == 2, result
    assert f"{path}:4:8: restart.on: 'nope' is no rule this playbook runs" in result.err, result
    assert "Traceback" not in result.err


def test_the_fx_family_and_compile_after_warmup_advice_says_how_to_turn_the_guard_and_restarts_on() -> None:
    import re

    from gpuops.agent.detect.compile_after_warmup import COMPILE_ADVICE
    from gpuops.agent.detect.judge import EAGER_ADVICE
    from gpuops.agent.wire.signatures.rules import advice

    for text in (advice("fx-tracing-race"), advice("fx-patcher-race"), EAGER_ADVICE, COMPILE_ADVICE):
        assert text and "launch.compile_guard: true" in text and "restart:" in text and "compile_guard: true}" in text
        # No advice names a PyTorch version nobody verified (the old "torch >= 2.14" was one).
        assert not re.search(r"torch\s*[<>=]+\s*\d|\b2\.1\d\b", text), text


@pytest.mark.parametrize(("on", "why"), [
    ("recompile-limit", "only warns"),  # a built-in warn rule
    ("throughput-drop", "is off"),  # no watch.throughput section
    ("gpu-memory-shift", "only warns (action: warn)"),  # the detector's default
])
def test_a_name_that_never_ends_an_attempt_is_a_validate_warning_at_its_place(tmp_path: Path, on: str, why: str) -> None:
    path = write(tmp_path, f"restart: {{max: 1, on: [stall, {on}]}}\n")
    pb = load_playbook(path, environ={})
    assert pb.warnings == (f"{path}:3:31: restart.on names '{on}', which {why}: it never ends an attempt, "
                           "so it never restarts one",), pb.warnings
    result = gpuops("validate", "-p", path)
    assert result.code == 0 and f"restart.on names '{on}'" in result.err, result


@pytest.mark.parametrize(("section", "said"), [
    ("restart: {max: 2}\n", "3:10: restart has no `on` (the rules whose end restarts an attempt"),
    ("restart: {on: [stall]}\n", "3:10: restart has no `max` (0 by default): no attempt is ever restarted"),
])
def test_a_restart_section_that_can_restart_nothing_is_a_validate_warning(tmp_path: Path, section: str, said: str) -> None:
    """Issue 35 item 11: these passed without a word, and the run never restarted. A warning, not an error: the run
    is exactly what the file says (`max: 0` turns restarts off on purpose and warns nothing)."""
    path = write(tmp_path, section)
    result = gpuops("validate", "-p", path)
    assert result.code == 0 and f"warning: {path}:{said}" in result.err, result
    assert load_playbook(write(tmp_path, "restart: {max: 0}\n"), environ={}).warnings == ()


def test_abort_rules_and_stall_warn_nothing(tmp_path: Path) -> None:
    pb = load_playbook(write(tmp_path, "restart: {max: 1, on: [fx-tracing-race, loss-nan, stall, failed]}\n"), environ={})
    assert pb.warnings == ()
