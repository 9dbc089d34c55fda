"""`gpuops stacks [RUN]` (every thread's stack of the live run's Python processes, now, the run going on) and
`gpuops logs --stacks [RUN]` (the stacks recorded before its abort), on each target asked for."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Iterator

from gpuops.cli.flows.run_flow import drive, each_target, renderer
from gpuops.cli.flows.which_run import check_run_id, pick
from gpuops.cli.reports.junit import NO_REPORT
from gpuops.client.events import Event, Outcome
from gpuops.client.selection import load_plays
from gpuops.errors import ExitCode, NoRun, UsageError

if TYPE_CHECKING:
    from gpuops.cli.roles import Render
    from gpuops.client.play import Play


def run_stacks(inventory: str | None, playbook: str | None, targets: tuple[str, ...], *, every: bool,
               run_id: str | None, recorded: bool, as_json: bool, verbose: bool) -> int:
    if run_id is not None:
        check_run_id(run_id)
    plays = load_plays(inventory, playbook, targets, every, need_env=False)
    if run_id is not None and len(plays) > 1:
        raise UsageError(f"run {run_id} is a run of one target: pass one -t (not {', '.join(j.target.name for j in plays)})")
    work = functools.partial(_one, run_id=run_id, recorded=recorded)
    return each_target(plays, work, renderer(as_json, verbose, multi=len(plays) > 1), NO_REPORT, as_json=as_json,
                       verbose=verbose, ordered=True)


def _one(play: Play, render: Render, *, run_id: str | None, recorded: bool) -> int:
    try:
        return drive(_events(play, run_id, recorded), render, play.target.name, {})
    finally:
        play.transport.close()


def _events(play: Play, run_id: str | None, recorded: bool) -> Iterator[Event | Outcome]:
    picked = pick(play, run_id)
    if picked.row is not None:  # an earlier run: never live
        run, state, live = picked.row["run"], picked.row.get("outcome"), False
        hang = (picked.row.get("job") or {}).get("hang")
    else:
        assert picked.info is not None  # pick gives an earlier run's row, or the current run
        run, state = picked.info.run_id, picked.info.state
        live = state == "running"
        hang = (picked.info.abort_done or {}).get("hang")
    if not recorded and not live:
        raise NoRun(f"{play.target.name}: run {run} is not running ({state}): it has no live stacks",
                    hint="`gpuops logs --stacks` shows the stacks recorded before its abort")
    rows = play.door.stacks(run, recorded=recorded)
    for row in rows:
        yield Event("stacks", play.target.name, run, row)
    threads = sum(int(r.get("threads") or 0) for r in rows)
    silent = [str(r["pid"]) for r in rows if not r.get("file")]
    if not rows:
        said = ("no stacks were recorded (watch.stacks, or no Python process was running)" if recorded
                else "no Python process of the run is running")
    else:
        said = (f"{'recorded' if recorded else 'now'}: {len(rows)} Python process(es), {threads} thread(s)"
                + (f"; no answer from pid {', '.join(silent)}" if silent else ""))
    if recorded and isinstance(hang, dict):  # a stalled torchrun job: where it hung, as every node read it
        said += f"; the job hung: {hang.get('text')}"
    yield Outcome("stacks", ExitCode.OK, f"run {run}: {said}", {"run": run, "stacks": [_entry(r) for r in rows],
                                                                 **({"hang": hang} if recorded and isinstance(hang, dict) else {})})


def _entry(row: dict[str, Any]) -> dict[str, Any]:
    """A process's line of the summary's `stacks` (as the abort record has it: no text)."""
    return {k: row[k] for k in ("pid", "rank", "local_rank", "file", "threads", "via", "attempt", "error") if k in row}
