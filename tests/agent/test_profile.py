"""Profiles built from real run-directory records, and the baseline the next run is judged by."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpuops.agent.detect.detectors import Baseline
from gpuops.agent.detect.profile import (
    baseline_from_config,
    build_profile,
    find_baseline,
    keep_profile,
    pick_baseline,
    run_digest,
    weighted_median,
)
from gpuops.agent.detect.telemetry import TelemetryLog
from gpuops.agent.wire.records import PROFILE, read_json
from gpuops.agent.wire.watchfile import detectors

START = "2026-12-01T10:25:00Z"
T0 = 1796120700.0  # START as epoch seconds
COMPILED, EAGER = 505695.0, 98364.0


def make_run(runs: Path, run_id: str, *, playbook: str = "dflash-drafter", seconds: float = 600,
             memory: int = 1443, tp: float | None = COMPILED, exit_code: str | None = "0\n",
             abort: dict | None = None, raw_keep: float = 3600.0) -> Path:
    """A run directory as gpuops leaves it: meta.json, samples with a start-up ramp, exit_code, abort.json."""
    run = runs / run_id
    run.mkdir(parents=True)
    started = T0 + (int(run_id[9:15]) - 102500)  # the id's time of day, as new_run_id() spells it
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    (run / "meta.json").write_text(json.dumps({"id": run_id, "playbook": playbook, "target": "ct200",
                                               "started_at": stamp, "gpus": [5], "warmup_seconds": {"5": 8.4}}))
    log = TelemetryLog(str(run), raw_keep=raw_keep)
    for i in range(int(seconds / 2)):
        t = started + 2 * i
        ramp = t < started + 30  # compile and allocation: not steady
        log.append(t, {5: (memory // 3 if ramp else memory, 5 if ramp else 17)}, {5: 1},
                   (tp / 10 if ramp else tp) if tp is not None else None)
    if exit_code is not None:
        (run / "exit_code").write_text(exit_code)
    if abort is not None:
        (run / "abort.json").write_text(json.dumps(abort))
    return run


def test_a_compiled_run_profiles_to_its_steady_figures(tmp_path: Path) -> None:
    run = make_run(tmp_path, "20261201-102500-3fa9c2")
    profile = keep_profile(str(run))
    assert read_json(str(run / PROFILE)) == profile
    assert (profile["run"], profile["playbook"], profile["target"], profile["started"]) == (
        "20261201-102500-3fa9c2", "dflash-drafter", "ct200", START)
    assert (profile["outcome"], profile["exit_code"], profile["command_exit_code"]) == ("succeeded", 0, 0)
    assert profile["throughput"] == {"median": COMPILED, "n": 270, "figures_per_s": None}  # 300 samples, 60 s not steady
    assert profile["gpus"] == {"5": {"median": 1443, "min": 1443, "max": 1443, "swing": 0, "util_median": 17}}
    assert profile["samples"] == 300 and profile["warmup_seconds"] == {"5": 8.4}
    assert profile["duration_s"] >= 598 and profile["rule"] is None


def test_a_stalled_run_says_so_with_its_rule_and_who_stopped_it(tmp_path: Path) -> None:
    run = make_run(tmp_path, "20261201-102500-3fa9c2", exit_code="130\n",
                   abort={"reason": "stall", "rule": None, "by": "watchdog"})
    profile = build_profile(str(run), findings=["throughput-drop", "throughput-drop"])
    assert (profile["outcome"], profile["exit_code"], profile["command_exit_code"], profile["by"]) == (
        "stalled", 8, 130, "watchdog")
    assert profile["findings"] == ["throughput-drop"]


def test_a_long_run_counts_coarse_buckets_for_their_samples_and_keeps_extremes(tmp_path: Path) -> None:
    run = make_run(tmp_path, "20261201-102500-3fa9c2", seconds=3 * 3600, raw_keep=600.0)
    with open(run / "samples.jsonl", "a") as f:  # one 4449 MiB spike at the end (the empty_cache phase's max)
        f.write('{"t":%d,"g":{"5":[4449,15]}}\n' % (T0 + 3 * 3600))
    profile = build_profile(str(run))
    assert os.path.getsize(run / "samples-coarse.jsonl") > 0
    assert profile["samples"] == 5401 and profile["throughput"]["n"] == 5370
    assert profile["gpus"]["5"] == {"median": 1443, "min": 1443, "max": 4449, "swing": 3006, "util_median": 17}


def test_a_run_without_records_profiles_without_crashing(tmp_path: Path) -> None:
    profile = build_profile(str(tmp_path / "20261201-102500-3fa9c2"))
    assert (profile["outcome"], profile["throughput"], profile["gpus"], profile["samples"]) == ("lost", None, {}, 0)


def test_the_baseline_is_the_newest_succeeded_run_of_the_playbook(tmp_path: Path) -> None:
    make_run(tmp_path, "20261201-102500-aaaaaa", memory=1443)  # the good one
    make_run(tmp_path, "20261201-103000-bbbbbb", memory=6249, exit_code="1\n")  # failed
    make_run(tmp_path, "20261201-103500-cccccc", playbook="other")  # another playbook
    make_run(tmp_path, "20261201-104000-dddddd", seconds=40)  # succeeded, too short for steady figures
    make_run(tmp_path, "20261201-104500-eeeeee", exit_code=None, abort={"reason": "rule", "rule": "fx-tracing-race"})
    make_run(tmp_path, "20261201-105000-ffffff", tp=EAGER)  # the run being judged now
    (tmp_path / "20261201-105500-garbled").mkdir()
    (tmp_path / "20261201-105500-garbled" / PROFILE).write_text("{")
    for run in sorted(tmp_path.iterdir()):
        if (run / "meta.json").exists():
            keep_profile(str(run))
    baseline = find_baseline(str(tmp_path), "dflash-drafter", exclude="20261201-105000-ffffff")
    assert baseline == Baseline("20261201-102500-aaaaaa", COMPILED, {5: 1443.0}, "last")
    assert find_baseline(str(tmp_path), "dflash-drafter").throughput == EAGER
    assert find_baseline(str(tmp_path), "nobody") is None
    assert find_baseline(str(tmp_path / "missing"), "dflash-drafter") is None


def test_playbook_numbers_win_and_the_last_run_fills_the_rest() -> None:
    last = Baseline("20261201-102500-aaaaaa", COMPILED, {5: 1443.0, 6: 1450.0}, "last")
    mixed = baseline_from_config(detectors({"throughput": {"baseline": 500000}, "gpu_memory": {"baseline": "last"}}), last,
                                 [5, 6])
    assert mixed == Baseline("20261201-102500-aaaaaa", 500000.0, {5: 1443.0, 6: 1450.0}, "playbook+last")
    given = baseline_from_config(detectors({"throughput": {"baseline": 500000}, "gpu_memory": {"baseline": 1443}}), last,
                                 [5, 6])
    assert given == Baseline(None, 500000.0, {5: 1443.0, 6: 1443.0}, "playbook")
    per_gpu = baseline_from_config(detectors({"gpu_memory": {"baseline": {"5": 1443}}}), None, [5])
    assert per_gpu == Baseline(None, None, {5: 1443.0}, "playbook")
    assert baseline_from_config(detectors({"throughput": {"baseline": "last"}}), last) == last
    assert baseline_from_config(detectors({"throughput": {"baseline": "last"}}), None) is None


def test_weighted_median() -> None:
    assert weighted_median([(1443, 1), (6249, 1), (1500, 1)]) == 1500
    assert weighted_median([(98364, 1), (505695, 30)]) == 505695  # one raw sample against a bucket of 30
    assert weighted_median([]) is None


def test_a_run_that_only_warned_is_no_baseline_and_a_changed_command_has_none(tmp_path: Path) -> None:
    # issue 19.6: good, then slow-but-succeeded with a throughput-drop warning, then the run being judged
    make_run(tmp_path, "20261201-102500-aaaaaa")
    slow = make_run(tmp_path, "20261201-103000-bbbbbb", tp=EAGER)
    for run in sorted(tmp_path.iterdir()):
        keep_profile(str(run), findings=["throughput-drop"] if run == slow else ())
    assert read_json(str(slow / PROFILE))["findings"] == ["throughput-drop"]
    assert find_baseline(str(tmp_path), "dflash-drafter", exclude="20261201-104000-cccccc").run == "20261201-102500-aaaaaa"
    # another batch size: the command differs, so there is no comparable baseline, and the note says why
    meta = json.loads((tmp_path / "20261201-102500-aaaaaa" / "meta.json").read_text())
    theirs = run_digest({**meta, "command": "python train.py --batch 64"})
    baseline, why = pick_baseline(str(tmp_path), "dflash-drafter", "20261201-104000-cccccc", digest=theirs)
    assert baseline is None and "another command, env, workdir or GPUs" in (why or "") and "20261201-102500-aaaaaa" in (why or "")
    same = run_digest(meta)
    assert pick_baseline(str(tmp_path), "dflash-drafter", "20261201-104000-cccccc", digest=same)[0].run == (
        "20261201-102500-aaaaaa")
    assert pick_baseline(str(tmp_path), "dflash-drafter", "20261201-104000-cccccc", target="ct201") == (None, None)


def test_findings_come_from_the_events_so_a_restarted_watchdog_loses_none(tmp_path: Path) -> None:
    run = make_run(tmp_path, "20261201-102500-aaaaaa", tp=EAGER)
    with open(run / "events.jsonl", "w") as f:  # the first watchdog reported it, then was killed and restarted
        f.write(json.dumps({"event": "match", "rule": "throughput-drop", "action": "warn", "figures": {"gpu": None}}) + "\n")
        f.write(json.dumps({"event": "note", "rule": "no-baseline", "figures": {"gpu": None}}) + "\n")
        f.write(json.dumps({"event": "match", "rule": "loss-nan", "action": "warn", "offset": 10}) + "\n")
    assert keep_profile(str(run), findings=[])["findings"] == ["throughput-drop"]


def test_a_run_in_another_workdir_or_on_other_gpus_is_no_baseline(tmp_path: Path) -> None:
    # issue 29.8c: a run in another workdir on 1 GPU took a 4-GPU run as its baseline
    make_run(tmp_path, "20261201-102500-aaaaaa")
    keep_profile(str(tmp_path / "20261201-102500-aaaaaa"))
    meta = json.loads((tmp_path / "20261201-102500-aaaaaa" / "meta.json").read_text())
    for other in ({**meta, "workdir": "/srv/other"}, {**meta, "gpus": [5, 6, 7, 8]}):
        baseline, why = pick_baseline(str(tmp_path), "dflash-drafter", "20261201-104000-cccccc", digest=run_digest(other))
        assert baseline is None and "workdir or GPUs" in (why or ""), other
    assert run_digest({**meta, "gpus": [7, 5]}) == run_digest({**meta, "gpus": [5, 7]})  # a set of GPUs, not an order
