"""Telemetry files: round trip, torn tails, bounded size over a simulated day and week, restarts and crashes."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from gpuops.agent.detect.cachewatch import CacheWatcher, inductor_cache_dir
from gpuops.agent.detect.telemetry import TelemetryLog, parse_lines, read_samples
from gpuops.agent.detect.throughput import Figures, figure
from gpuops.agent.wire.records import SAMPLES, SAMPLES_COARSE

T0 = 1796120709.83  # 2026-12-01 10:25:09.83 UTC, when REFERENCE.md measured the quiet failures
COMPILED, EAGER = 505695.0, 98364.0


def feed(run_dir: Path, seconds: float, gpus: int, *, interval: float = 2.0, start: float = T0,
         log: TelemetryLog | None = None) -> TelemetryLog:
    """A run's samples at a fixed interval: six-digit MiB figures (the worst case for size), a process each, tok/s."""
    log = log or TelemetryLog(str(run_dir))
    rng = random.Random(7)
    noise = [rng.uniform(0.9, 1.1) for _ in range(997)]
    procs = dict.fromkeys(range(gpus), 1)
    for i in range(int(seconds / interval)):
        gpu_rows = {g: (int(131000 * noise[(i + g) % 997]), int(17 * noise[(i * 3 + g) % 997])) for g in range(gpus)}
        log.append(start + i * interval, gpu_rows, procs, COMPILED * noise[i % 997])
    return log


def size(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.iterdir())


def test_a_sample_round_trips_with_missing_figures(tmp_path: Path) -> None:
    log = TelemetryLog(str(tmp_path))
    log.append(T0, {5: (1443, 17), 6: (None, None)}, {5: 1, 6: 0}, COMPILED)
    log.append(T0 + 2, {5: (6249, 19)})
    line = (tmp_path / SAMPLES).read_text().splitlines()[0]
    assert line == '{"t":1796120709.83,"g":{"5":[1443,17],"6":[null,null]},"p":{"5":1,"6":0},"tp":505695}'
    first, second = read_samples(str(tmp_path))
    assert (first.t, first.gpus, first.procs, first.throughput) == (T0, {5: (1443, 17), 6: (None, None)}, {5: 1, 6: 0}, COMPILED)
    assert (second.memory(5), second.memory(7), second.procs, second.throughput) == (6249, None, None, None)


def test_a_tail_cut_mid_line_loses_only_the_torn_lines(tmp_path: Path) -> None:
    log = TelemetryLog(str(tmp_path))
    for i in range(10):
        log.append(T0 + 2 * i, {5: (1443 + i, 17)})
    data = (tmp_path / SAMPLES).read_bytes()
    tail = data[-(len(data) // 2):] + b'{"t":1796120800,"g":{"5":[14'  # `tail -c N`, a line being written
    samples = parse_lines(tail)
    assert [s.memory(5) for s in samples] == list(range(1443 + 10 - len(samples), 1453))
    assert 3 <= len(samples) < 10
    assert parse_lines(b"\xff\xfe garbage\n[1,2]\n{}\n") == []


def test_rotation_folds_old_samples_into_buckets_keeping_extremes(tmp_path: Path) -> None:
    log = TelemetryLog(str(tmp_path), raw_keep=600.0, bucket=60.0)
    for i in range(600):  # 20 minutes at 2 s; one 4449 MiB spike (the empty_cache phase's max) at 62 s
        log.append(1796120700.0 + 2 * i, {5: (4449 if i == 31 else 1063 + i % 3, 15)}, {5: 1}, EAGER + i % 5)
    samples = read_samples(str(tmp_path))
    coarse = [s for s in samples if s.coarse]
    assert coarse and coarse[0].t == 1796120700.0 and coarse[0].span == 60.0 and coarse[0].n == 30
    assert (coarse[1].low[5], coarse[1].memory(5), coarse[1].high[5]) == (1063, 1064, 4449)
    assert coarse[0].throughput == EAGER + 2 and coarse[0].procs == {5: 1}
    assert sum(s.n for s in samples) == 600
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    raw = [s for s in samples if not s.coarse]
    assert raw[-1].t - raw[0].t <= 600.0 + 60.0 + 150.0  # raw_keep, a bucket, a quarter of raw_keep


@pytest.mark.parametrize("gpus", [3, 8])
def test_a_day_at_2_s_stays_under_1_mb(tmp_path: Path, gpus: int) -> None:
    feed(tmp_path, 86400, gpus)
    assert size(tmp_path) <= 1_000_000
    assert (tmp_path / SAMPLES).stat().st_size <= 450_000
    samples = read_samples(str(tmp_path))
    assert sum(s.n for s in samples) == 43200 and samples[0].t == pytest.approx(T0 - T0 % 60)


@pytest.mark.slow
def test_a_week_of_8_gpus_stays_under_1_mb_a_day(tmp_path: Path) -> None:
    feed(tmp_path, 7 * 86400, 8)
    assert size(tmp_path) <= 4_000_000  # the module docstring says so; the brief allows 7 MB
    assert (tmp_path / SAMPLES).stat().st_size <= 450_000
    assert sum(s.n for s in read_samples(str(tmp_path))) == 7 * 43200


def test_a_restarted_watchdog_carries_on_without_duplicates(tmp_path: Path) -> None:
    feed(tmp_path, 3 * 3600, 3)
    feed(tmp_path, 3 * 3600, 3, start=T0 + 3 * 3600, log=TelemetryLog(str(tmp_path)))
    samples = read_samples(str(tmp_path))
    assert sum(s.n for s in samples) == 2 * 5400
    assert (tmp_path / SAMPLES).stat().st_size <= 200_000


def test_a_crash_between_fold_and_rewrite_duplicates_nothing(tmp_path: Path) -> None:
    log = feed(tmp_path, 4400, 3, log=TelemetryLog(str(tmp_path)))
    raw_before = (tmp_path / SAMPLES).read_bytes()
    log.rotate(T0 + 4400)
    (tmp_path / SAMPLES).write_bytes(raw_before)  # as if the rename never happened
    assert sum(s.n for s in read_samples(str(tmp_path))) == 2200
    coarse_lines = len((tmp_path / SAMPLES_COARSE).read_text().splitlines())
    TelemetryLog(str(tmp_path)).rotate(T0 + 4400)  # the restarted watchdog folds again
    assert len((tmp_path / SAMPLES_COARSE).read_text().splitlines()) == coarse_lines
    assert sum(s.n for s in read_samples(str(tmp_path))) == 2200
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


def test_figures_give_the_median_since_the_last_sample() -> None:
    figures = Figures()
    assert figures.take() is None
    for value in (505695.0, 98364.0, 434225.0, float("nan")):
        figures.add(value)
    assert figures.take() == 434225.0
    assert figures.take() is None


def test_figure_reads_the_first_group_with_separators() -> None:
    pattern = re.compile(r"tok/s (\S+)")
    assert figure(pattern, "step 120 loss 2.31 tok/s 505695") == 505695.0
    assert figure(pattern, "step 121 tok/s 98,364.5") == 98364.5
    assert figure(pattern, "step 122 tok/s n/a") is None
    assert figure(pattern, "loss 2.3") is None
    assert figure(re.compile(r"\d+(?= tok/s)"), "434225 tok/s") == 434225.0
    assert figure(re.compile(r"tok/s (\d+)?x"), "tok/s x") is None


def populate(cache: Path, counts: dict[str, int], tag: str) -> None:
    """Files as a flex_attention fwd+bwd compile leaves them (REFERENCE.md: triton/ 40, fxgraph/ 2, aotautograd/ 1, ...)."""
    for folder, n in counts.items():
        for i in range(n):
            path = cache / folder / f"{tag}{i:03d}" / "kernel.bin"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")


def test_the_cache_watcher_counts_files_a_missed_shape_adds(tmp_path: Path) -> None:
    cache = tmp_path / "torchinductor_root"
    populate(cache, {"triton/0": 40, "fxgraph": 2, "aotautograd": 1, "ab": 8}, "warm")  # the one-shape warmup: 51
    watcher = CacheWatcher(str(cache))
    assert watcher.snapshot() == 51 and watcher.new_files() == (0, [])
    populate(cache, {"triton/0": 41, "fxgraph": 2, "aotautograd": 1, "cd": 9}, "miss")  # three new shapes
    (cache / "triton" / "0" / "x.lock").write_text("")  # lock and temporary files come and go on cache hits
    (cache / "fxgraph" / "y.tmp.123").write_text("")
    count, examples = watcher.new_files()
    assert count == 53 and len(examples) == 5 and examples == sorted(examples)
    assert all("miss" in e for e in examples) and not watcher.truncated


def test_the_cache_watcher_walk_is_bounded_and_follows_no_symlinks(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    populate(cache, {"triton": 30}, "a")
    outside = tmp_path / "outside"
    populate(outside, {"big": 100}, "b")
    (cache / "link").symlink_to(outside, target_is_directory=True)
    watcher = CacheWatcher(str(cache))
    assert watcher.snapshot() == 30
    small = CacheWatcher(str(cache), limit=10)
    assert small.snapshot() < 10 and small.truncated


def test_a_missing_cache_is_no_files_and_a_cache_created_later_is_all_new(tmp_path: Path) -> None:
    cache = tmp_path / "torchinductor_root"
    watcher = CacheWatcher(str(cache))
    assert watcher.snapshot() == 0 and watcher.new_files() == (0, [])
    populate(cache, {"triton": 3}, "n")
    assert watcher.new_files()[0] == 3


def test_the_cache_folder_follows_torch_s_rule() -> None:
    assert inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": "/root/.cache/inductor", "USER": "x"}) == "/root/.cache/inductor"
    assert inductor_cache_dir({"USER": "root"}) == "/tmp/torchinductor_root"
    assert inductor_cache_dir({"LOGNAME": 'dom\\ann', "TMPDIR": "/scratch"}) == "/scratch/torchinductor_dom_ann"
