"""Which run `gpuops logs` shows: the session's current run, or with `--run ID` one of its earlier runs.

Run ids live on the target (its run directories, as `gpuops runs` lists them), so an id is checked
there: one the session never had is exit 2, naming the runs it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuops.client.events import Outcome
from gpuops.errors import ExitCode, NoRun, UsageError

if TYPE_CHECKING:
    from gpuops.agent.wire.runinfo import RunInfo
    from gpuops.client.play import Play

HISTORY_LIMIT = 1000  # run directories read for an id: years of runs of one session
NAMED = 10  # runs named when an id is unknown


@dataclass
class Picked:
    """The current run (`info`, as the probe read it), or an earlier one (`row`, its history record)."""

    info: RunInfo | None = None
    row: dict[str, Any] | None = None


def check_run_id(run_id: str) -> str:
    """Refuse what cannot be a run id before connecting (ids name folders on the target)."""
    from gpuops.agent.wire.protocol import check_run_id as check

    try:
        return check(run_id)
    except ValueError:
        raise UsageError(f"--run {run_id!r}: not a run id (they look like 20261129-101500-3fa9c2; "
                         "`gpuops runs` lists them)") from None


def pick(play: Play, run_id: str | None) -> Picked:
    """The run to show: the current one, or run_id (its own session's); NoRun (exit 2) when there is none."""
    from gpuops.client.outcome import session_state

    state = session_state(play)
    current = state.run if state is not None else None
    if run_id is None or (current is not None and current.run_id == run_id):
        if current is None:
            raise NoRun(f"{play.target.name}: no run of '{play.session}' found in ~/.gpuops",
                        hint="start one with `gpuops launch`")
        return Picked(info=current)
    rows = [r for r in play.door.runs(HISTORY_LIMIT) if r.get("session") == play.session]
    for row in rows:
        if row["run"] == run_id:
            return Picked(row=row)
    known = ", ".join(r["run"] for r in rows[:NAMED]) + (f" and {len(rows) - NAMED} more" if len(rows) > NAMED else "")
    said = f"its runs, newest first: {known}" if rows else "it has no runs there"
    raise NoRun(f"{play.target.name}: session '{play.session}' has no run {run_id}; {said}",
                hint=f"`gpuops runs -t {play.target.name}` lists every run of the target")


def recorded_outcome(row: dict[str, Any]) -> Outcome:
    """An earlier run's end as its records say (it is not the session's current run, so it is over)."""
    run, rule, by = row["run"], row.get("rule"), row.get("by")
    code = row.get("exit_code")
    name = str(row.get("outcome") or "lost")
    if code is None:  # neither an exit code nor an abort record, and the session has moved on: lost
        name, code = "lost", ExitCode.TRAINING_FAILED
    words = f"run {run} ended earlier: {name} (exit {code})"
    if rule:
        words += f"; rule '{rule}'"
    if by:
        words += f"; stopped by {by}"
    if isinstance(row.get("hardware"), dict):
        from gpuops.agent.wire.verdict import record_words

        words += f"; {record_words(row['hardware'])}"
    data = {"run": run, "rule": rule, "by": by, "command_exit_code": row.get("command_exit_code"),
            "hardware": row.get("hardware")}
    return Outcome(name, int(code), words, {k: v for k, v in data.items() if v is not None})
