"""Commands as values: every user value arrives literally through each shell layer; secrets never show."""

from __future__ import annotations

import subprocess

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.command import MASK, Cmd, Raw, Script, Secret, bash, export

# Text a shell would love to interpret: quotes, substitutions, separators, newlines, tabs, non-ASCII, dashes.
_pieces = list("ab -'\"$()`;&|<>*?~!#{}[]\\\n\t\u00e9\u4e2d=%") + ["$(touch /tmp/pwn)", "`id`", "--", "-n", "-e"]
hostile = st.lists(st.sampled_from(_pieces), max_size=20).map("".join)


def _through_two_layers(cmd: Cmd) -> str:
    """What a login shell does with a remote command line: parse it once; our bash -c parses the inner script."""
    outer = cmd.render()
    return subprocess.run(["bash", "-c", outer], capture_output=True, text=True, check=True).stdout


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=hostile)
def test_export_value_arrives_literally_through_two_shell_layers(value: str) -> None:
    script = Script(export("GPUOPS_T", value), Raw('printf "%s" "$GPUOPS_T"'))
    assert _through_two_layers(bash(script)) == value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(hostile, min_size=1, max_size=4))
def test_argv_words_arrive_literally(words: list[str]) -> None:
    script = Script(Cmd("printf", "%s\\0", *words))
    assert _through_two_layers(bash(script)).split("\0")[:-1] == words


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command=hostile)
def test_a_user_command_reaches_the_inner_bash_as_one_word(command: str) -> None:
    # The playbook's command is shell for the innermost bash: it must arrive there byte for byte.
    script = Script(Cmd("printf", "%s", Cmd("bash", "-c", command)))
    assert _through_two_layers(bash(script)) == Cmd("bash", "-c", command).render()
    inner = Script(Cmd("printf", "%s", command))
    assert _through_two_layers(bash(inner)) == command


def test_secret_is_masked_for_display_and_real_when_sent() -> None:
    script = Script(export("HF_TOKEN", Secret("hf_abc'$(rm -rf x)")), Raw('printf "%s" "$HF_TOKEN"'))
    cmd = Cmd("pct", "exec", "200", "--", *bash(script).argv)
    assert "hf_abc" not in cmd.render(display=True)
    assert MASK in cmd.render(display=True)
    assert _through_two_layers(bash(script)) == "hf_abc'$(rm -rf x)"


def test_pct_wrapping_splices_argv_and_quotes_the_script_once_per_layer() -> None:
    script = Script(Cmd("cd", "--", "/my dir"), Raw("pwd"))
    rendered = Cmd("pct", "exec", "200", "--", *bash(script).argv).render()
    assert rendered.startswith("pct exec 200 -- bash -c '")
    assert "'\"'\"'/my dir'\"'\"'" in rendered


def test_export_refuses_names_that_are_not_identifiers() -> None:
    import pytest

    for bad in ("A-B", "1A", "A B", "A;rm", "", "É"):
        with pytest.raises(ValueError):
            export(bad, "x")


def test_raw_words_cannot_be_executed_without_a_shell() -> None:
    import pytest

    with pytest.raises(ValueError):
        Cmd("echo", Raw("$HOME")).words()
