"""config/redos.py: patterns Python's backtracking `re` can take exponential time on, and the many it cannot."""

from __future__ import annotations

import re
import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.config.redos import risky

# (pattern, the part to blame as risky() names it). Each is exponential on a line that almost matches.
RISKY = [
    (r"(a+)+b", "(a+)+ nests a repeat in a repeat"),
    (r"(a*)*b", "(a*)* nests a repeat in a repeat"),
    (r"(?:a+)+b", "(?:a+)+ nests a repeat in a repeat"),
    (r"(a+?)+b", "(a+?)+ nests a repeat in a repeat"),
    (r"^(a+)+$", "(a+)+ nests a repeat in a repeat"),
    (r"(\d+)+x", r"(\d+)+ nests a repeat in a repeat"),
    (r"^(\w+\s?)*$", r"(\w+\s?)* nests a repeat in a repeat"),
    (r"\[(\w+\s*)*\]", r"(\w+\s*)* nests a repeat in a repeat"),
    (r"(\s*,\s*)*x", r"(\s*,\s*)* nests a repeat in a repeat"),
    (r"(x+x+)+y", "(x+x+)+ nests a repeat in a repeat"),
    (r"(.*a){2,}b", "(.*a){2,} nests a repeat in a repeat"),
    (r"loss: (\d+\.?\d*)+ nan", r"(\d+\.?\d*)+ nests a repeat in a repeat"),
    (r"(?:[^\s\"]+|\"[^\"]*\")+$", r"(?:[^\s\"]+|\"[^\"]*\")+ nests a repeat in a repeat"),
    (r"^(([a-z])+.)+[A-Z]([a-z])+$", "(([a-z])+.)+ nests a repeat in a repeat"),  # OWASP's example
    (r"(\w+|foo)*!", r"(\w+|foo)* nests a repeat in a repeat"),
    (r"(a|a)*b", "(a|a)* repeats alternatives that can match the same text"),
    (r"(a|a?)+b", "(a|a?)+ repeats alternatives that can match the same text"),
    (r"(.|\s)*END", r"(.|\s)* repeats alternatives that can match the same text"),
    (r"(a|b|ab)*c", "(a|b|ab)* repeats alternatives that can match the same text"),
    (r"(\d|\d\d)+x", r"(\d|\d\d)+ repeats alternatives that can match the same text"),
    (r"(?i)(ab|AB)+!", "(ab|AB)+ repeats alternatives that can match the same text"),
    (r"(a{1,2})*b", "(a{1,2})* can match the same text in many ways"),
    (r"(?:a{1,100}){1,100}b", "(?:a{1,100}){1,100} nests a repeat in a repeat"),
    (r"(" * 60 + "a" + ")*" * 60 + "b", "((a)*)* nests a repeat in a repeat"),
]

# Patterns found in training-log rules and throughput readers: none of them may raise a false alarm.
SAFE = [
    r"loss (nan|inf)\b",
    r"tok/s (\d+)",
    r"^\[rank\d+\]",
    r"step (\d+)/(\d+)",
    r"([0-9.]+) it/s",
    r"tokens/sec:\s*(\d+(?:\.\d+)?)",
    r"loss[=:]\s*([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)",
    r"RuntimeError: CUDA error: (.*)",
    r"NCCL (WARN|INFO) .*timeout",
    r"(?i)out of memory",
    r"^\s*File \"(.+)\", line (\d+)",
    r"^(?:\S+\s+){2}ERROR",
    r".*foo.*bar",  # polynomial at worst, bounded by the line length: not reported
    r"\b(\d{1,3}\.){3}\d{1,3}\b",
    r"^(\w+)=(\w+)(?:,(\w+)=(\w+))*$",
    r"[a-z]+(?:-[a-z]+)*$",
    r"^(?:[a-z0-9-]+\.)+[a-z]{2,}$",
    r"(?:\s*\d+\s*,)*$",
    r"(\d+,)*x",  # a repeat in a repeat, but the ',' fixes where each turn ends
    r"(?:\w+\s+)*\w+$",  # the same: \s+ separates the turns
    r"(\\.|[^\"\\])*\"",  # a C string: the two alternatives never match the same character
    r"(a|ab)*c",  # alternatives share a first letter, but not a whole text
    r"(a|b)*c",
    r"(?:foo|bar)+baz",
    r"(?:ab|cd)*e",
    r"(\w|\d)+!",  # the parser merges these alternatives into one class
    r"(?>a+)+b",  # an atomic group is never backtracked into
    r"(a++)+b",  # nor is a possessive repeat
    r"(\w+\s?)*",  # ambiguous, but nothing after it can fail: the first try matches
    r"x(a|a)*",
    r"Epoch \d+: 100%\|[#█ ]+\| \d+/\d+",
    r"\x1b\[[0-9;]*m",
]


@pytest.mark.parametrize(("pattern", "blame"), RISKY)
def test_catastrophic_patterns_are_named_with_the_part_to_blame(pattern: str, blame: str) -> None:
    why = risky(pattern)
    assert why is not None and why.startswith(blame), why


@pytest.mark.parametrize("pattern", SAFE)
def test_common_patterns_raise_no_false_alarm(pattern: str) -> None:
    re.compile(pattern)
    assert risky(pattern) is None


def test_a_flagged_pattern_really_is_exponential_and_its_safe_twin_is_not() -> None:
    """Measured on this machine's `re`: a few more characters double the time of the flagged one."""
    def seconds(pattern: str, line: str) -> float:
        start = time.perf_counter()
        re.search(pattern, line)
        return time.perf_counter() - start

    assert risky(r"^(\w+\s?)*$") and risky(r"^(\w+\s)*$") is None
    slow = seconds(r"^(\w+\s?)*$", "a" * 18 + "!")
    assert seconds(r"^(\w+\s?)*$", "a" * 22 + "!") > 4 * slow
    assert seconds(r"^(\w+\s)*$", "a " * 5000 + "!") < 0.5


@pytest.mark.parametrize("pattern", ["(" * 300 + "a" + ")*" * 300 + "b", "a" * 5000, "(a|b)" * 150 + "+$",
                                     "((a{6}){6}){6}x", "(?P<x>a+)(?P=x)+b", "(?(1)a|b)+c", "(?=a+)+b"])
def test_huge_or_odd_patterns_are_answered_quickly(pattern: str) -> None:
    start = time.perf_counter()
    risky(pattern)
    assert time.perf_counter() - start < 2.0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab()|*+?{},.\\dws[]^$-", max_size=24))
def test_any_compilable_pattern_gets_a_quick_answer(pattern: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "possible set difference" and the like
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError):
            return
    start = time.perf_counter()
    why = risky(pattern)
    assert why is None or why.endswith(("many ways", "the same text")), why
    assert time.perf_counter() - start < 1.0
