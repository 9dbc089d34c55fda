"""Run-directory records: the one outcome mapping (same codes as today's RunInfo), tolerant reads, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuops.agent.wire.protocol import SCHEMA_VERSION
from gpuops.agent.wire.records import command_exit_code, outcome, read_json, write_json_atomic
from gpuops.agent.wire.runinfo import RunInfo

CASES = [
    # exit_code file text, abort.json, session alive -> outcome
    (None, {"reason": "stall", "rule": None}, False, ("stalled", 8)),
    (None, {"reason": "timeout"}, True, ("timeout", 124)),
    ("130\n", {"reason": "stop"}, False, ("stopped", 6)),
    ("0\n", {"reason": "rule", "rule": "fx-tracing-race"}, False, ("aborted", 7)),  # the abort decides, not exit 0
    (None, {"rule": "throughput-drop"}, True, ("aborted", 7)),
    ("0\n", None, False, ("succeeded", 0)),
    ("0\n", None, True, ("succeeded", 0)),  # the command ended; a lingering session changes nothing
    ("1\n", None, False, ("failed", 6)),
    ("137\n", None, False, ("failed", 6)),
    (None, None, True, ("running", None)),
    (None, None, False, ("lost", 6)),
]


@pytest.mark.parametrize("exit_text, abort, alive, expected", CASES)
def test_outcome(exit_text: str | None, abort: dict | None, alive: bool, expected: tuple) -> None:
    assert outcome(exit_text, abort, alive) == expected


@pytest.mark.parametrize("exit_text, abort, alive, expected", [c for c in CASES if c[3][0] not in ("lost", "running")])
def test_the_exit_code_is_the_one_runs_py_reports_today(exit_text: str | None, abort: dict | None, alive: bool,
                                                          expected: tuple) -> None:
    info = RunInfo("r", "s", exit_code=command_exit_code(exit_text), abort=abort, session_alive=alive)
    assert outcome(exit_text, abort, alive)[1] == info.outcome_code()


def test_a_garbled_exit_code_file_still_means_the_command_ended() -> None:
    assert command_exit_code("") is None and command_exit_code("x") is None
    assert outcome("", None, True) == ("failed", 6)


def test_read_json_is_none_for_missing_garbled_non_object_and_oversized(tmp_path: Path) -> None:
    good, torn, listed, big = (tmp_path / n for n in ("good", "torn", "list", "big"))
    good.write_text('{"reason": "stall"}')
    torn.write_text('{"reason": "st')
    listed.write_text("[1, 2]")
    big.write_text(json.dumps({"x": "y" * 100}))
    assert read_json(str(good)) == {"reason": "stall"}
    assert read_json(str(tmp_path / "missing")) is None
    assert read_json(str(torn)) is None and read_json(str(listed)) is None
    assert read_json(str(big), limit=50) is None and read_json(str(big)) is not None
    assert read_json(str(tmp_path)) is None  # a directory


def test_write_json_atomic_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("old")
    write_json_atomic(str(path), {"outcome": "succeeded", "n": 1})
    assert read_json(str(path)) == {"outcome": "succeeded", "n": 1, "schema_version": SCHEMA_VERSION}
    assert os.listdir(tmp_path) == ["profile.json"]


def test_write_json_atomic_failure_keeps_the_old_record(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text('{"old": true}')
    with pytest.raises(TypeError):
        write_json_atomic(str(path), {"bad": object()})
    assert read_json(str(path)) == {"old": True} and os.listdir(tmp_path) == ["profile.json"]
