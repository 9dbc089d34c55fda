"""Sparklines of GPU memory for `gpuops status`, on REFERENCE.md's H200 phases."""

from __future__ import annotations

import random

from gpuops.agent.wire.samples import parse_lines
from gpuops.cli.renderers.spark import BLOCKS, memory_series, shape, sparkline


def test_a_flat_compiled_run_is_one_level() -> None:
    line = sparkline([1443] * 70)
    assert line == BLOCKS[3] * 30
    assert shape([1443] * 70, 2048) == "flat"


def test_a_short_series_is_as_long_as_it_is() -> None:
    assert sparkline([1443, 6249]) == BLOCKS[0] + BLOCKS[7]
    assert sparkline([]) == "" and sparkline([1443], width=0) == ""


def test_the_lowest_and_highest_values_take_the_bottom_and_top_blocks() -> None:
    line = sparkline([1541 + 2062 * i / 7 for i in range(8)])  # a step per new shape: 1541 -> 3603 MiB
    assert line == BLOCKS


def test_an_empty_cache_swing_looks_volatile_after_downsampling() -> None:
    rng = random.Random(5)
    values = [rng.choice((1063, 4449)) for _ in range(150)]  # five minutes at 2 s
    line = sparkline(values, width=30)
    assert len(line) == 30 and set(line) == {BLOCKS[0], BLOCKS[7]}
    assert shape(values, 2048) == "volatile"


def test_a_spike_is_not_averaged_away() -> None:
    values = [1443] * 149 + [6249]
    assert sparkline(values, width=30)[-1] == BLOCKS[7] and sparkline(values, width=30)[0] == BLOCKS[0]


def test_jitter_under_min_span_draws_flat_and_gaps_are_spaces() -> None:
    line = sparkline([1443, 1444, None, 1443], min_span=256)
    assert line == BLOCKS[3] + BLOCKS[3] + " " + BLOCKS[3]
    assert sparkline([None, None]) == "  "
    assert shape([1443, None, 1500], 2048) == "flat" and shape([], 2048) == "flat"


def test_memory_series_reads_a_gpu_from_the_sample_lines() -> None:
    text = '{"t":1796120709.83,"g":{"5":[1443,17]}}\n{"t":1796120711.83,"g":{"5":[null,null],"6":[6249,19]}}\n'
    assert memory_series(parse_lines(text), 5) == [1443, None]
    assert memory_series(parse_lines(text), 6) == [None, 6249]
