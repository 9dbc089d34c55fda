"""The stall clock on a simulated clock: fixed timeouts, the learned one, and its documented hazard."""

from __future__ import annotations

from gpuops.agent.wire.stall import AUTO_DEFAULTS, StallClock

T0 = 1796120709.83
AUTO = {"floor": 30, "factor": 5, "settle": 60, "initial": 900}


def printing(clock: StallClock, start: float, end: float, every: float) -> float:
    """The log grows every `every` seconds from start to end; returns the last growth."""
    t = start
    while t <= end:
        clock.grew(t)
        t += every
    return t - every


def test_fixed_timeout_counts_from_the_last_growth() -> None:
    clock = StallClock(900, None, T0)
    clock.grew(T0 + 100)
    assert clock.silent_for(T0 + 999) == 899
    assert not clock.stalled(T0 + 999) and clock.stalled(T0 + 1000)
    clock.grew(T0 + 1000)
    assert not clock.stalled(T0 + 1899) and clock.timeout_now(T0) == 900


def test_a_run_that_never_prints_stalls_from_its_start() -> None:
    clock = StallClock(900, None, T0)
    assert not clock.stalled(T0 + 899) and clock.stalled(T0 + 900)


def test_zero_is_off() -> None:
    clock = StallClock(0, None, T0)
    assert clock.timeout_now(T0) == 0 and not clock.stalled(T0 + 10 ** 7)


def test_auto_uses_initial_until_settled_and_five_gaps_seen() -> None:
    clock = StallClock(0, AUTO, T0)
    last = printing(clock, T0, T0 + 60, 2.0)  # all before settle: nothing learned
    assert clock.gaps == 0 and clock.timeout_now(last) == 900
    for k in range(1, 5):
        clock.grew(last + 2 * k)
    assert clock.gaps == 4 and clock.timeout_now(last + 8) == 900
    clock.grew(last + 10)
    assert clock.learned() and clock.timeout_now(last + 10) == 30  # max(floor 30, 5 x 2 s)
    assert not clock.stalled(last + 10 + 29.9) and clock.stalled(last + 10 + 30)


def test_a_silent_compile_before_settle_is_not_learned() -> None:
    clock = StallClock(0, AUTO, T0)
    clock.grew(T0 + 55)  # 55 s of compile, silent
    last = printing(clock, T0 + 62, T0 + 120, 2.0)
    assert clock.longest_gap == 2.0 and clock.timeout_now(last) == 30


def test_the_learned_timeout_grows_with_longer_gaps_survived() -> None:
    clock = StallClock(0, AUTO, T0)
    last = printing(clock, T0, T0 + 200, 2.0)
    clock.grew(last + 20)  # an eval, silent for 20 s
    assert clock.longest_gap == 20 and clock.timeout_now(last + 20) == 100
    assert not clock.stalled(last + 20 + 99) and clock.stalled(last + 20 + 100)


def test_known_hazard_a_first_checkpoint_longer_than_the_learned_timeout_is_a_stall() -> None:
    clock = StallClock(0, AUTO, T0)
    last = printing(clock, T0, T0 + 300, 2.0)  # learned 30 s
    assert clock.stalled(last + 45)  # a 45 s checkpoint save would be stopped: the docstring says so
    clock_with_floor = StallClock(0, {**AUTO, "floor": 600}, T0)
    last = printing(clock_with_floor, T0, T0 + 300, 2.0)
    assert not clock_with_floor.stalled(last + 45)


def test_auto_starts_from_the_playbook_timeout_when_no_initial_is_given() -> None:
    assert StallClock(1200, {"floor": 30}, T0).timeout_now(T0) == 1200
    assert StallClock(0, {}, T0).timeout_now(T0) == AUTO_DEFAULTS["initial"]


def test_a_clock_stepping_back_teaches_nothing() -> None:
    clock = StallClock(0, AUTO, T0)
    last = printing(clock, T0, T0 + 200, 2.0)
    clock.grew(last - 100)
    assert clock.last_growth == last and clock.longest_gap == 2.0


def test_describe_and_restore_carry_the_learning_across_a_watchdog_restart() -> None:
    clock = StallClock(0, AUTO, T0)
    last = printing(clock, T0, T0 + 200, 2.0)
    state = clock.describe()
    assert state["mode"] == "auto" and state["learned"] and state["timeout"] == 30 and state["longest_gap"] == 2.0
    again = StallClock(0, AUTO, T0)
    again.restore(state)
    assert again.timeout_now(last) == 30 and again.silent_for(last + 5) == 5
    assert StallClock(900, None, T0).describe() == {
        "mode": "fixed", "timeout": 900, "longest_gap": None, "gaps": 0, "last_growth": T0}
