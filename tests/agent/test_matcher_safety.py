"""The matcher's safeguards: a user pattern that backtracks forever is disabled, not obeyed; secrets are
masked before any cut; a matcher restarted at a checkpoint finds the same hits; metric rules read figures."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuops.agent.wire.masking import Masker
from gpuops.agent.wire.signatures import Matcher, builtin_rules, metric_rule, regex_rule
from gpuops.agent.wire.signatures.budget import Guard

REAL = Path(__file__).parent.parent / "data" / "real_h200"
LOGS = Path(__file__).parent.parent / "data" / "logs"
CATASTROPHIC = r"(a+)+$"  # exponential on 'aaa...ab'


def test_a_catastrophic_user_pattern_is_disabled_and_the_builtin_rules_still_fire() -> None:
    m = Matcher([*builtin_rules(), regex_rule("redos", CATASTROPHIC)], guard=Guard(budget=0.3))
    started = time.monotonic()
    hits = m.feed(b"a" * 40 + b"b\n" + (REAL / "fx-race.log").read_bytes()) + m.finish()
    took = time.monotonic() - started
    assert [h.rule for h in hits][:1] == ["fx-tracing-race"]
    assert [name for name, _ in m.guard.take_disabled()] == ["redos"]
    assert m.guard.take_disabled() == []  # reported once
    assert took < 30  # unguarded, 40 a's take minutes; the budget is 0.3 s


def test_a_disabled_rule_stays_off_but_other_user_rules_keep_matching() -> None:
    m = Matcher([regex_rule("redos", CATASTROPHIC), regex_rule("loss-nan", r"loss (nan|inf)\b")], guard=Guard(budget=0.2))
    hits = m.feed(b"a" * 40 + b"b\nstep 1 loss nan\n" + b"a" * 40 + b"b\n") + m.finish()
    assert [(h.rule, h.line_number) for h in hits] == [("loss-nan", 2)]
    assert list(m.guard.disabled) == ["redos"]


def test_the_guard_gives_back_a_timer_that_was_running() -> None:
    import signal

    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        m = Matcher([regex_rule("slow", CATASTROPHIC)], guard=Guard(budget=0.2))
        m.feed(b"a" * 30 + b"b\n")
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left < 1.0
        assert signal.getsignal(signal.SIGALRM) is not m.guard._on_tick
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("cut_at", [990, 995, 999, 1003])
def test_a_secret_straddling_the_excerpt_cut_never_shows_a_piece(cut_at: int) -> None:
    secret = "hf_" + "S3cr3tT0k3nV4lu3x" * 2
    line = "x" * (cut_at - 10) + secret + " tail"
    data = f"Traceback (most recent call last):\n  File \"t.py\", line 1, in f\n    f()\nRuntimeError: boom {line}\n"
    m = Matcher([regex_rule("boom", "boom")], mask=Masker([secret]))
    (hit,) = m.feed(data.encode()) + m.finish()
    for text in (hit.line, hit.excerpt):
        for i in range(len(secret) - 7):
            assert secret[i : i + 8] not in text


def test_restarting_at_a_checkpoint_finds_the_same_hits_once() -> None:
    """A watchdog restarted at its saved checkpoint reports what one uninterrupted matcher would: cut at
    every line end (and mid-line), resume where checkpoint() says, and the hits before and after add up."""
    data = (LOGS / "fx_race_interleaved.txt").read_bytes() + (LOGS / "faulthandler_timeout.txt").read_bytes()
    whole = [(h.rule, h.line_number, h.offset) for h in Matcher(builtin_rules()).feed(data)]
    assert [rule for rule, _, _ in whole] == ["fx-tracing-race"] * 3 + ["faulthandler-timeout"]
    line_ends = [i + 1 for i, byte in enumerate(data) if byte == 10]
    resumed_with: list[int] = []  # how many of the hits each checkpointed cut had already seen
    for cut in sorted({0, *line_ends, *range(0, len(data), 97)}):
        first = Matcher(builtin_rules())
        seen = [(h.rule, h.line_number, h.offset) for h in first.feed(data[:cut])]
        point = first.checkpoint()
        if point is None:  # a traceback is open or a line is cut: no checkpoint there, by design
            continue
        offset, line = point
        again = Matcher(builtin_rules(), start_offset=offset, start_line=line)
        resumed = [(h.rule, h.line_number, h.offset) for h in again.feed(data[offset:])]
        merged = seen + [h for h in resumed if h not in seen]
        assert merged == whole, cut
        resumed_with.append(len(seen))
    # the resumed matcher had hits to find: before any hit, and between the FX race and the faulthandler dump
    assert 0 in resumed_with and 3 in resumed_with, resumed_with


def test_metric_rules_read_every_figure_and_never_hit() -> None:
    m = Matcher([*builtin_rules(), metric_rule("throughput", r"tok/s (\d+)")])
    hits = m.feed(b"step 1 loss 3.2 tok/s 505695\nstep 2 tok/s 98364\nnothing\n")
    assert hits == []
    assert [(x.value, x.line_number) for x in m.take_measures()] == [("505695", 1), ("98364", 2)]
    assert m.take_measures() == []
