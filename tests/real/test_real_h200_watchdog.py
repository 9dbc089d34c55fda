"""What gpuops' watchdog caught on a real NVIDIA H200 with real PyTorch 2.11 through its real path (ssh +
pct into a CT whose processes were real: tools/real_h200.py), replayed here through the same matcher,
detectors and stall clock: the verdicts must be the ones the watchdog wrote on that machine.

The records are in tests/data/real_h200/watchdog/<case>/ (README.md there says what each case ran).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuops.agent.detect.detectors import Detectors
from gpuops.agent.detect.profile import baseline_from_profile, build_profile
from gpuops.agent.run.abort import claim, wait_done
from gpuops.agent.wire.records import outcome, read_json
from gpuops.agent.wire.ruleset import build_matcher, stall_config
from gpuops.agent.wire.samples import parse_lines
from gpuops.agent.wire.stall import StallClock
from gpuops.agent.wire.watchfile import detectors, parse

REAL = Path(__file__).parent.parent / "data" / "real_h200" / "watchdog"
DETECTORS = {"throughput-drop", "gpu-memory-shift", "gpu-memory-volatile", "compile-after-warmup"}


def load(case: str, name: str) -> Any:
    text = (REAL / case / name).read_text()
    return [json.loads(line) for line in text.splitlines()] if name.endswith(".jsonl") else json.loads(text)


def events(case: str, kind: str = "match") -> list[dict[str, Any]]:
    return [e for e in load(case, "events.jsonl") if e["event"] == kind]


def profile(case: str) -> dict[str, Any]:
    """The profile the run kept, which the agent's profile code, run again over the recorded samples,
    meta and abort records, must rebuild."""
    kept = read_json(str(REAL / case / "profile.json"))
    assert kept is not None
    rebuilt = build_profile(str(REAL / case), settle=kept["settle"])
    for key in [k for k in ("gpus", "samples", "digest", "findings", "rule", "by") if k in kept]:  # an older record lacks some
        assert rebuilt[key] == kept[key], (case, key)
    assert (rebuilt["throughput"] or {}).get("median") == (kept["throughput"] or {}).get("median"), case
    return kept


def stopped_by(case: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The abort claim in force and its end, as the agent's abort sequence reads them: a later stop
    (on a copy of the run directory) loses the claim to the recorded one."""
    d = tmp_path / case
    shutil.copytree(REAL / case, d)
    won, record = claim(str(d), {"reason": "stop", "by": "stop"})
    assert not won
    return record, wait_done(str(d), 1.0)


@pytest.mark.parametrize("case", ["baseline", "eager", "eager-race", "compile", "detach", "deadlock"])
def test_the_log_replayed_through_the_matcher_gives_the_watchdogs_matches(case: str) -> None:
    cfg = parse(load(case, "watch.json"))
    matcher = build_matcher(cfg)
    hits = matcher.feed((REAL / case / "log").read_bytes()) + matcher.finish()
    recorded = [(e["rule"], e["line_number"]) for e in events(case) if e["rule"] not in DETECTORS]
    assert [(h.rule, h.line_number) for h in hits] == recorded


def test_the_compiled_baseline_ran_to_the_end_with_no_alarm_and_kept_its_profile() -> None:
    assert load("baseline", "summary.json")["exit_code"] == 0
    assert [e for e in load("baseline", "events.jsonl") if e["event"] == "match"] == []
    kept = profile("baseline")
    assert kept["outcome"] == "succeeded" and kept["throughput"]["median"] > 1_000_000
    assert kept["gpus"]["0"]["median"] > 500


def replay_detectors(case: str, baseline_case: str) -> list[Any]:
    """The case's GPU samples and throughput figures fed to the detectors, judged at every sample."""
    cfg = parse(load(case, "watch.json"))
    samples = parse_lines((REAL / case / "samples.jsonl").read_text())
    baseline = baseline_from_profile(load(baseline_case, "profile.json"))
    det = Detectors(cfg.detectors, baseline, samples[0].t - 1.0)
    found = []
    for s in samples:
        if s.throughput is not None:
            det.measure(s.t, "throughput", str(s.throughput))
        det.sample(s.t, s.gpus)
        found += det.judge(s.t)
    return found


def test_the_eager_fallback_is_a_throughput_drop_and_a_memory_shift_against_the_compiled_run() -> None:
    summary = load("eager", "summary.json")
    assert (summary["exit_code"], summary["rule"], summary["by"]) == (7, "throughput-drop", "watchdog")
    drop = next(e for e in events("eager") if e["rule"] == "throughput-drop")
    shift = next(e for e in events("eager") if e["rule"] == "gpu-memory-shift")
    assert drop["figures"]["ratio"] < 0.2 and shift["figures"]["ratio"] > 2
    assert drop["figures"]["baseline_run"] == load("baseline", "profile.json")["run"]
    rules = [(e["rule"], e["action"]) for e in events("eager")]
    assert ("flex-attention-unfused", "warn") in rules and ("fx-patcher-race", "warn") in rules
    replayed = {f.rule for f in replay_detectors("eager", "baseline") if f.action != "note"}
    assert {"throughput-drop", "gpu-memory-shift"} <= replayed


def test_the_baseline_replayed_against_itself_raises_no_alarm() -> None:
    assert [f.rule for f in replay_detectors("baseline", "baseline") if f.action != "note"] == []


def test_the_eager_fallbacks_own_thread_race_aborts(tmp_path: Path) -> None:
    summary = load("eager-race", "summary.json")
    assert (summary["exit_code"], summary["rule"]) == (7, "fx-patcher-race")
    assert "CURRENT_PATCHER is None in finally block" in summary["excerpt"]
    record, _ = stopped_by("eager-race", tmp_path)
    assert (record["by"], record["rule"]) == ("watchdog", "fx-patcher-race")
    assert outcome(None, record, False) == ("aborted", summary["exit_code"])
    assert (profile("eager-race")["outcome"], profile("eager-race")["exit_code"]) == ("aborted", 7)


def test_shapes_the_warmup_missed_are_compile_after_warmup() -> None:
    (found,) = [e for e in events("compile") if e["rule"] == "compile-after-warmup"]
    assert found["figures"]["measured"] > 0 and found["action"] == "warn"
    assert any(x.startswith(("fxgraph/", "triton/", "aotautograd/")) or "/" in x for x in found["figures"]["examples"])
    cfg = load("compile", "watch.json")
    det = Detectors(detectors({"compile_after_warmup": cfg["compile_after_warmup"]}), None, 0.0)
    det.cache_files(cfg["compile_after_warmup"]["settle"] + 1, found["figures"]["measured"], found["figures"]["examples"])
    assert [f.rule for f in det.judge(cfg["compile_after_warmup"]["settle"] + 1)] == ["compile-after-warmup"]


def test_a_detached_run_hitting_the_fx_race_is_stopped_by_its_watchdog_and_logs_f_exits_7(tmp_path: Path) -> None:
    record, done = stopped_by("detach", tmp_path)
    assert (record["by"], record["rule"]) == ("watchdog", "fx-tracing-race")
    assert done is not None and done["survivors"] == [] and [g["memory_used_mib"] for g in done["gpus"]] == [0]
    assert outcome(None, record, False)[1] == profile("detach")["exit_code"] == 7
    assert load("detach", "summary.json")["exit_code"] == 7  # `logs -f` afterwards, from a client that was not there
    assert "logs -f exit 7" in (REAL / "detach" / "timing.txt").read_text()


def test_a_cold_cache_compile_in_three_threads_that_hangs_is_stopped_as_a_stall() -> None:
    record = load("deadlock", "abort.json")
    assert (record["reason"], record["by"]) == ("stall", "watchdog")
    assert load("deadlock", "summary.json")["exit_code"] == 8
    timeout, auto = stall_config(parse(load("deadlock", "watch.json")))
    clock = StallClock(timeout, auto, 0.0)  # the log never grew: no training step was ever printed
    assert not clock.stalled(record["seconds"] - 1) and clock.stalled(record["seconds"])
