"""A restarted run's profile and baselines: the run's profile is its last attempt's; an aborted attempt
is never a baseline (its records, moved by the watchdog's own restarts.begin_next, are not searched)."""

from __future__ import annotations

import json
from pathlib import Path

from test_profile import COMPILED, EAGER, T0, make_run

from gpuops.agent.detect.profile import find_baseline, keep_profile
from gpuops.agent.detect.telemetry import TelemetryLog
from gpuops.agent.run import restart as restarts
from gpuops.agent.wire.records import write_json_atomic
from gpuops.agent.wire.watchfile import parse

CFG = parse({"restart": {"max": 2, "on": ["throughput-drop", "fx-tracing-race"], "delay": 0}})
DROP = {"reason": "match", "rule": "throughput-drop", "by": "watchdog"}


def restarted(run: Path, abort: dict) -> None:
    """Attempt 1 ended by `abort`: its profile kept as the watchdog keeps it, then the restart's rotation."""
    (run / "started").write_text("1\n")
    (run / "abort.json").write_text(json.dumps(abort))
    with open(run / "events.jsonl", "a") as f:  # what attempt 1's watchdog reported
        f.write(json.dumps({"event": "match", "rule": abort["rule"], "action": "abort", "figures": {"gpu": None}}) + "\n")
    assert restarts.due(str(run), CFG) == abort["rule"]
    keep_profile(str(run))
    restarts.begin_next(str(run), CFG, abort["rule"], lambda event, **data: _event(run, event, **data))


def second_attempt_ran(run: Path, tp: float, seconds: float = 300) -> None:
    """Attempt 2 started (as carry_out records it) and its watchdog sampled it."""
    started = T0 + 3600
    rec = json.loads((run / "attempt.json").read_text())
    write_json_atomic(str(run / "attempt.json"), {**rec, "state": "running", "started": started})
    log = TelemetryLog(str(run))
    for i in range(int(seconds / 2)):
        log.append(started + 2 * i, {5: (1443, 17)}, {5: 1}, tp)


def _event(run: Path, event: str, **data: object) -> None:
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": event, **data}) + "\n")


def test_an_aborted_first_attempt_is_no_baseline_and_the_succeeded_last_attempt_is(tmp_path: Path) -> None:
    good = make_run(tmp_path, "20261201-102500-aaaaaa", tp=EAGER, exit_code=None)  # attempt 1: the eager fallback
    restarted(good, DROP)
    first = json.loads((good / "attempts" / "1" / "profile.json").read_text())
    assert (first["outcome"], first["attempts"]) == ("aborted", 1)
    second_attempt_ran(good, COMPILED)
    (good / "exit_code").write_text("0\n")  # attempt 2 succeeded
    profile = keep_profile(str(good))
    # The run's profile is attempt 2's: succeeded, and attempt 1's finding is not its own.
    assert (profile["outcome"], profile["attempts"], profile["findings"]) == ("succeeded", 2, [])
    assert profile["throughput"]["median"] == COMPILED  # attempt 2's figures, not attempt 1's
    assert find_baseline(str(tmp_path), "dflash-drafter", exclude="20261201-109000-zzzzzz").run == good.name


def test_a_run_whose_last_attempt_was_aborted_is_no_baseline(tmp_path: Path) -> None:
    older = make_run(tmp_path, "20261201-102500-aaaaaa", tp=COMPILED)
    keep_profile(str(older))
    newer = make_run(tmp_path, "20261201-104000-bbbbbb", tp=EAGER, exit_code=None)
    restarted(newer, DROP)
    second_attempt_ran(newer, COMPILED)
    (newer / "abort.json").write_text(json.dumps(DROP))  # attempt 2 aborted too: the restarts ran out
    assert keep_profile(str(newer))["outcome"] == "aborted"
    assert find_baseline(str(tmp_path), "dflash-drafter", exclude="20261201-109000-zzzzzz").run == older.name
