"""Quiet-failure detectors on a simulated clock, with the H200 figures of REFERENCE.md.

compiled: 505,695 tok/s, 1443 MiB flat; eager fallback: 98,364 tok/s, 6249 MiB flat; eager with
empty_cache: 1063-4449 MiB swinging; a missed shape: ~50 new inductor cache files.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import pytest

from gpuops.agent.detect.detectors import MIN_FIGURES, Baseline, Detectors, Finding
from gpuops.agent.detect.profile import find_baseline, keep_profile
from gpuops.agent.detect.telemetry import TelemetryLog
from gpuops.agent.detect.throughput import Figures
from gpuops.agent.wire.watchfile import detectors

T0 = 1796120709.83
COMPILED, EAGER, SLOWER = 505695.0, 98364.0, 470000.0
LEVEL, EAGER_LEVEL = 1443, 6249
GOOD = Baseline("20261201-102500-3fa9c2", COMPILED, {5: float(LEVEL), 6: float(LEVEL), 7: float(LEVEL)}, "last")
ALL = {k: {} for k in ("throughput", "gpu_memory", "compile_after_warmup")}  # each with its defaults
CONFIG = detectors(ALL)
COMPILE_ONLY = detectors({"compile_after_warmup": {}})
SETTLE, WINDOW, INTERVAL = 60.0, 30.0, 2.0

Curve = Callable[[float], Optional[float]]


def simulate(det: Detectors, seconds: float, tp: Curve, memory: Callable[[float], Optional[int]],
             gpus: Tuple[int, ...] = (5,)) -> List[Tuple[float, Finding]]:
    """A figure in the log every second, a GPU sample and a judgement every 2 s; seconds since start."""
    found: List[Tuple[float, Finding]] = []
    for tick in range(int(seconds)):
        t = T0 + tick
        value = tp(tick)
        if value is not None:
            det.measure(t, "throughput", str(value))
        if tick % int(INTERVAL) == 0:
            det.sample(t, {g: (memory(tick), 17) for g in gpus})
            found += [(tick, f) for f in det.judge(t)]
    return found


def rules(found: List[Tuple[float, Finding]]) -> List[str]:
    return [f.rule for _, f in found]


def flat(value: float) -> Curve:
    return lambda _t: value


def test_a_5x_drop_from_the_start_is_reported_within_settle_window_and_two_samples() -> None:
    found = simulate(Detectors(CONFIG, GOOD, T0), 600, flat(EAGER), flat(LEVEL))
    assert rules(found) == ["throughput-drop"]
    at, finding = found[0]
    assert at <= SETTLE + WINDOW + 2 * INTERVAL
    assert finding.action == "warn" and finding.figures["measured"] == EAGER and finding.figures["gpu"] is None
    assert finding.figures["baseline"] == COMPILED and finding.figures["baseline_run"] == GOOD.run
    assert finding.figures["ratio"] == round(EAGER / COMPILED, 4) and finding.figures["window"] == WINDOW
    assert "98,364/s" in finding.message and "0.19x" in finding.message and GOOD.run in finding.message
    assert "FX thread-safety race" in finding.advice and "one lock" in finding.advice and "launch.compile_guard: true" in finding.advice and "2.14" not in finding.advice


def test_a_drop_mid_run_is_reported_within_a_window_and_two_samples() -> None:
    found = simulate(Detectors(CONFIG, GOOD, T0), 900, lambda t: COMPILED if t < 300 else EAGER, flat(LEVEL))
    assert rules(found) == ["throughput-drop"]
    assert 300 < found[0][0] <= 300 + WINDOW + 2 * INTERVAL


def test_470k_against_505k_is_not_a_drop() -> None:
    assert simulate(Detectors(CONFIG, GOOD, T0), 900, flat(SLOWER), flat(LEVEL)) == []


def test_a_slow_start_up_before_settle_is_not_judged() -> None:
    found = simulate(Detectors(CONFIG, GOOD, T0), 600, lambda t: EAGER if t < SETTLE else COMPILED,
                     lambda t: 300 if t < SETTLE else LEVEL)
    assert found == []


def test_one_report_per_episode_and_a_new_one_only_after_a_full_window_back_in_range() -> None:
    def tp(t: float) -> float:
        # slow, back for 100 s (re-arms), slow again, back for only 20 s (does not), slow to the end
        return COMPILED if 200 <= t < 300 or 400 <= t < 420 else EAGER

    found = simulate(Detectors(CONFIG, GOOD, T0), 600, tp, flat(LEVEL))
    assert rules(found) == ["throughput-drop", "throughput-drop"]
    assert found[0][0] <= SETTLE + WINDOW + 2 * INTERVAL and 300 < found[1][0] <= 300 + WINDOW + 2 * INTERVAL


def every(seconds: int, value: float) -> Curve:
    """A step line with its figure every `seconds` seconds."""
    return lambda t: value if int(t) % seconds == 0 else None


def test_a_5x_slowdown_with_fewer_figures_than_a_window_holds_is_still_a_drop() -> None:
    # issue 19.7: the good run logs a step every 8 s (3-4 figures a 30 s window); 5x slower logs one every 40 s
    base = replace(GOOD, figure_rate=1 / 8)
    found = simulate(Detectors(CONFIG, base, T0), 600, every(40, EAGER), flat(LEVEL))
    assert rules(found) == ["throughput-drop"], [f.message for _, f in found]
    at, finding = found[0]  # one figure in the first window past settle, where the good run had 3-4
    assert at <= SETTLE + WINDOW + INTERVAL and "fewer step lines" in finding.message
    # the same slow figures against a baseline without a rate: judged on the last three figures
    (at, finding), = simulate(Detectors(CONFIG, GOOD, T0), 600, every(40, EAGER), flat(LEVEL))
    assert finding.rule == "throughput-drop" and finding.figures["measured"] == EAGER and "0.19x" in finding.message
    assert at <= SETTLE + 3 * 40 + INTERVAL and "its last 3 figures" in finding.message
    # and the good rate itself is not a drop
    assert simulate(Detectors(CONFIG, base, T0), 900, every(8, COMPILED), flat(LEVEL)) == []


def test_step_lines_far_rarer_than_the_baselines_are_a_drop_even_when_each_figure_looks_good() -> None:
    base = replace(GOOD, figure_rate=1.0)  # one step line a second
    (at, finding), = simulate(Detectors(CONFIG, base, T0), 600, every(5, COMPILED), flat(LEVEL))
    assert finding.rule == "throughput-drop" and finding.figures["figure_rate"] == 0.2
    assert finding.figures["baseline_figure_rate"] == 1.0 and "fewer step lines" in finding.message
    assert at <= SETTLE + WINDOW + 2 * INTERVAL


def test_the_eager_memory_level_is_a_shift_and_a_small_change_is_not() -> None:
    found = simulate(Detectors(CONFIG, GOOD, T0), 600, flat(COMPILED), flat(EAGER_LEVEL), gpus=(5, 6))
    assert sorted((f.rule, f.figures["gpu"]) for _, f in found) == [("gpu-memory-shift", 5), ("gpu-memory-shift", 6)]
    finding = found[0][1]
    assert finding.figures["measured"] == EAGER_LEVEL and finding.figures["baseline"] == LEVEL
    assert finding.figures["ratio"] == round(EAGER_LEVEL / LEVEL, 4) and "4.33x" in finding.message
    assert found[0][0] <= SETTLE + MIN_FIGURES * INTERVAL and "FX thread-safety race" in finding.advice
    assert simulate(Detectors(CONFIG, GOOD, T0), 600, flat(COMPILED), flat(1500)) == []


def test_memory_far_below_the_baseline_is_a_shift_with_its_own_advice() -> None:
    (_, finding), = simulate(Detectors(CONFIG, GOOD, T0), 300, flat(COMPILED), flat(700))
    assert finding.rule == "gpu-memory-shift" and finding.figures["ratio"] < 1 / 1.5
    assert "Exception in thread" in finding.advice


def test_memory_swinging_like_empty_cache_is_volatile_without_a_baseline() -> None:
    swing = random.Random(3)
    found = simulate(Detectors(CONFIG, None, T0), 600, flat(79189), lambda t: swing.randint(1063, 4449))
    assert rules(found) == ["no-baseline", "gpu-memory-volatile"]
    note, volatile = found[0][1], found[1][1]
    assert note.action == "note" and "throughput" in note.message and "GPU memory" in note.message
    assert volatile.figures["measured"] > 2048 and volatile.figures["gpu"] == 5 and volatile.action == "warn"
    assert volatile.figures["swings"] >= 3 and volatile.figures["kind"] == "swings"
    assert found[1][0] <= SETTLE + WINDOW / 2  # three moves beyond 2048 MiB: a few samples of random swings


def test_without_a_baseline_a_5x_drop_is_one_note_and_nothing_else() -> None:
    found = simulate(Detectors(CONFIG, None, T0), 900, flat(EAGER), flat(EAGER_LEVEL))
    assert rules(found) == ["no-baseline"]


def test_a_pattern_that_matches_nothing_is_noted_once() -> None:
    found = simulate(Detectors(CONFIG, GOOD, T0), 600, lambda t: None, flat(LEVEL))
    assert rules(found) == ["no-throughput"] and found[0][0] <= SETTLE + WINDOW + INTERVAL


def test_new_cache_files_after_settle_are_a_compile_after_warmup() -> None:
    det = Detectors(COMPILE_ONLY, None, T0)
    det.cache_files(T0 + 10, 3, ["triton/0/a.json"])  # during settle: the run's own start-up
    assert det.judge(T0 + 70) == []
    det.cache_files(T0 + 80, 3 + 53, ["triton/1/b.cubin", "fxgraph/x/y", "aotautograd/z"])
    (finding,) = det.judge(T0 + 82)
    assert finding.rule == "compile-after-warmup" and finding.figures["measured"] == 53
    assert "53 new inductor cache file(s)" in finding.message and "triton/1/b.cubin" in finding.message
    assert "warm every shape" in finding.advice
    det.cache_files(T0 + 90, 60, [])
    assert det.judge(T0 + 92) == []  # the same episode
    for t in range(94, 160, 2):
        assert det.judge(T0 + t) == []  # a quiet window re-arms it
    det.cache_files(T0 + 160, 110, [])
    assert [f.figures["measured"] for f in det.judge(T0 + 162)] == [50]


def test_recompiling_lines_after_settle_are_a_compile_after_warmup() -> None:
    line = ("V1201 10:25:09.832000 434 torch/_dynamo/guards.py:4760] [0/1] [__recompiles] Recompiling function "
            "flex_attention in .../torch/nn/attention/flex_attention.py:1468")
    det = Detectors(COMPILE_ONLY, None, T0)
    det.measure(T0 + 20, "recompiles", line)  # during settle
    det.measure(T0 + 20, "recompiles", "step 10 tok/s 505695")
    assert det.judge(T0 + 70) == []
    det.measure(T0 + 75, "recompiles", line)
    (finding,) = det.judge(T0 + 76)
    assert finding.figures["functions"] == ["flex_attention"] and "recompiled flex_attention" in finding.message


def test_no_false_alarm_over_20_good_runs_each_judged_by_the_previous_ones_profile(tmp_path: Path) -> None:
    rng = random.Random(20261201)
    previous = None
    for n in range(20):
        run_id = "20261201-%06d-%06x" % (100000 + n * 100, n)
        run = tmp_path / run_id
        run.mkdir()
        (run / "meta.json").write_text('{"playbook": "dflash-drafter", "id": "%s"}' % run_id)
        baseline = find_baseline(str(tmp_path), "dflash-drafter", exclude=run_id)
        assert (baseline.run if baseline else None) == previous
        det = Detectors(CONFIG, baseline, T0)
        found = good_run(run, det, rng)
        assert rules(found) == (["no-baseline"] if n == 0 else []), (n, [f.message for _, f in found])
        (run / "exit_code").write_text("0\n")
        profile = keep_profile(str(run), **det.profile())
        assert profile["throughput"]["figures_per_s"] == 1.0  # a figure every second
        previous = run_id


def good_run(run: Path, det: Detectors, rng: random.Random) -> List[Tuple[float, Finding]]:
    """Ten minutes of a compiled run on GPUs 5-7, every figure within +-10 % of the H200's, logged as the watchdog would."""
    log, figures, found = TelemetryLog(str(run)), Figures(), []
    for tick in range(600):
        t = T0 + tick
        value = COMPILED * rng.uniform(0.9, 1.1)
        det.measure(t, "throughput", str(value))
        figures.add(value)
        if tick % 2 == 0:
            gpus = {g: (int(LEVEL * rng.uniform(0.9, 1.1)), 17) for g in (5, 6, 7)}
            det.sample(t, gpus)
            log.append(t, gpus, dict.fromkeys(gpus, 1), figures.take())
            found += [(tick, f) for f in det.judge(t)]
    return found


def test_without_a_baseline_the_jump_to_the_eager_level_still_shows_as_volatile() -> None:
    found = simulate(Detectors(CONFIG, None, T0), 600, flat(COMPILED), lambda t: LEVEL if t < 300 else EAGER_LEVEL)
    assert rules(found) == ["no-baseline", "gpu-memory-volatile"]
    at, finding = found[1]
    assert 300 + WINDOW / 2 <= at <= 300 + WINDOW / 2 + 2 * INTERVAL  # the new level held for half a window
    assert (finding.figures["first"], finding.figures["last"]) == (LEVEL, EAGER_LEVEL)
    assert finding.figures["kind"] == "jump" and "jumps to a new level" in finding.advice


def test_one_checkpoint_excursion_is_not_volatile_the_eager_fallbacks_swings_are() -> None:
    # issue 19.6: a checkpoint holds +3 GiB for 2 s (one sample at 2 s) once, mid-run; compiled otherwise
    def checkpoint(t: float) -> int:
        return LEVEL + 3072 if 300 <= t < 302 else LEVEL

    assert simulate(Detectors(CONFIG, GOOD, T0), 600, flat(COMPILED), checkpoint) == []
    # the eager fallback: 1063 <-> 4449 MiB every ~0.7 s, sampled every 2 s (REFERENCE.md)
    found = simulate(Detectors(CONFIG, None, T0), 600, flat(79189),
                     lambda t: 4449 if int(t / 0.7) % 2 else 1063)
    assert rules(found) == ["no-baseline", "gpu-memory-volatile"]
    assert found[1][1].figures["kind"] == "swings" and found[1][0] <= SETTLE + 4 * INTERVAL


def test_the_note_says_why_no_earlier_run_is_comparable() -> None:
    why = "run 20261201-102500-3fa9c2 ran another command, env, workdir or GPUs (a changed batch size is a new measure, not a regression)"
    (_, note), = simulate(Detectors(CONFIG, None, T0, no_baseline=why), 300, flat(EAGER), flat(EAGER_LEVEL))
    assert note.rule == "no-baseline" and note.message.startswith("no comparable baseline for throughput")
    assert why in note.message and note.figures["why"] == why and "same command, env, workdir and GPUs" in note.advice


@pytest.mark.parametrize("seconds", [8, 12, 16])
def test_an_excursion_whose_way_out_left_the_window_is_no_jump(seconds: int) -> None:
    # issue 29.8a: +3 GiB for 8-16 s in a 30 s window read "jumped from 4,515 to 1,443 MiB and stayed"
    # once its up-move left the window (16 s is over half the window: its median is a shift, said as one)
    def excursion(t: float) -> int:
        return LEVEL + 3072 if 300 <= t < 300 + seconds else LEVEL

    found = simulate(Detectors(CONFIG, GOOD, T0), 600, flat(COMPILED), excursion)
    assert "gpu-memory-volatile" not in rules(found), [f.message for _, f in found]


def test_a_2_s_excursion_in_a_6_s_window_sampled_twice_a_second_is_no_volatility() -> None:
    config = detectors({**ALL, "gpu_memory": {"window": 6, "settle": 10}})
    det, found = Detectors(config, GOOD, T0), []
    for tick in range(400):
        t = T0 + tick / 2
        det.sample(t, {5: (LEVEL + 3072 if 100 <= tick / 2 < 102 else LEVEL, 17)})
        found += det.judge(t)
    assert [f.rule for f in found if f.rule == "gpu-memory-volatile"] == [], [f.message for f in found]


def test_a_periodic_eval_pause_is_no_throughput_drop() -> None:
    # issue 29.8b: a 40 s pause every 300 s read as "0.46x, fewer step lines" though each figure is unchanged
    base = replace(GOOD, figure_rate=1.0)
    found = simulate(Detectors(CONFIG, base, T0), 1000, lambda t: None if t % 300 >= 260 else COMPILED, flat(LEVEL))
    assert found == [], [f.message for _, f in found]
