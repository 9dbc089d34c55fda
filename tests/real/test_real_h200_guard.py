"""The compile guard and restarts on a real NVIDIA H200 with real PyTorch 2.11, through gpuops' real path
(ssh + pct into a CT whose processes were real: tools/real_h200.py cases guard, guard-module, restart,
guard-cost), replayed here: what gpuops said, what the run directory kept, and that each record still
reads as the current code reads it. tests/data/real_h200/guard/README.md says what each case ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuops.agent.guard.counts import Counts
from gpuops.agent.watch.supervise import done
from gpuops.agent.wire import protocol as p
from gpuops.agent.wire.records import outcome, read_json, read_text
from gpuops.agent.wire.ruleset import build_matcher
from gpuops.agent.wire.runinfo import RunInfo
from gpuops.agent.wire.watchfile import parse

REAL = Path(__file__).parent.parent / "data" / "real_h200" / "guard"


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]


def summary(case: str, name: str = "gpuops.jsonl") -> dict[str, Any]:
    """What gpuops said at the end, checked against what the run directory says as the agent reads it."""
    end = jsonl(REAL / case / name)[-1]
    d = REAL / case
    if (d / p.META).exists():
        name, code = outcome(read_text(str(d / p.EXIT_CODE)), read_json(str(d / p.ABORT)), False)
        assert (name, code) == (end["outcome"], end["exit_code"]), case
        assert done(str(d)), case  # the watchdog's last heartbeat says it finished the run
    return end


def counts(case: str) -> dict[str, Any]:
    """One process's compile-guard counts, read as the agent reads records, named as the guard names them
    now, and summed as `gpuops status` shows them."""
    (only,) = list((REAL / case / p.COMPILE_GUARD_COUNTS).glob("*.json"))
    record = read_json(str(only))
    assert record is not None and set(record) <= set(Counts().as_record()), case
    shown = RunInfo("r", "s", meta={"compile_guard": True}, guard_counts=[record]).compile_guard
    assert shown is not None and shown["processes"] == 1 and shown["serialized"] == record["serialized"]
    return record


def test_the_cold_three_thread_first_calls_complete_detached_with_the_guard() -> None:
    """The deadlock case's workload (cold caches, three threads first-calling their own compiled
    flex_attention fwd+bwd at once) with launch.compile_guard: true, nobody attached: exit 0."""
    end = summary("guard")
    assert (end["outcome"], end["exit_code"], end["attempts"]) == ("succeeded", 0, 1)
    assert json.loads((REAL / "guard" / "playbook.json").read_text())["launch"]["compile_guard"] is True
    log = (REAL / "guard" / "log").read_text()
    assert all(f"drafter-{i}: 5 steps done" in log for i in (1, 2, 3))
    c = counts("guard")
    assert c["serialized"] == 3 and c["unguarded"] == 0 and c["backward_holds"] == 3 and c["backward_timeouts"] == 0
    # status, polled while it ran, showed the guard's counts for the live run
    runs = [sess["run"] for s in jsonl(REAL / "guard" / "status.jsonl") for sess in s.get("sessions") or []
            if sess.get("run")]
    live = [r["compile_guard"] for r in runs if r["state"] == "running" and r.get("compile_guard")]
    assert live and live[-1]["serialized"] >= 1 and live[-1]["processes"] == 1


def test_the_same_run_without_the_guard_stalls_and_is_restarted_with_it_to_completion_detached() -> None:
    end = summary("restart")
    assert (end["outcome"], end["exit_code"], end["attempts"]) == ("succeeded", 0, 2)
    (first,) = end["earlier_attempts"]
    assert (first["outcome"], first["exit_code"], first["rule"], first["compile_guard"]) == ("stalled", 8, "stall", False)
    ev = jsonl(REAL / "restart" / "events.jsonl")
    (restart,) = [e for e in ev if e["event"] == "restart"]
    assert (restart["after"], restart["attempt"], restart["compile_guard"]) == ("stall", 2, True)
    # every attempt's log kept: the silent first one (stopped by the stall clock), the guarded second one
    assert "steps done" not in (REAL / "restart" / "attempts" / "1" / "log").read_text()
    assert "done: 5 steps" in (REAL / "restart" / "log").read_text()


def test_three_threads_train_their_own_module_compile_block_under_the_guard() -> None:
    """nn.Module.compile() of Linear + flex_attention, fwd+bwd+SGD, 20 steps a thread, cold caches."""
    end = summary("module")
    assert (end["outcome"], end["exit_code"]) == ("succeeded", 0)
    log = (REAL / "module" / "log").read_text()
    assert all(f"drafter-{i}: 20 steps done" in log for i in (1, 2, 3))
    assert counts("module")["backward_holds"] == 3


def test_without_the_backward_hold_the_module_run_deadlocked_as_its_stacks_show() -> None:
    """What the hold fixes (the guard before it): thread 1's lazy backward compile and thread 2's forward
    compile under the exclusive side, stuck; faulthandler's dump matched and the run was stopped."""
    end = summary("module-deadlock")
    assert (end["rule"], end["exit_code"]) == ("faulthandler-timeout", 7)
    stacks = (REAL / "module-deadlock" / "log").read_text()
    assert "compile_fx_backward" in stacks and "acquire_exclusive" in stacks and "_engine_run_backward" in stacks
    assert "steps done" not in stacks
    c = counts("module-deadlock")
    assert c["serialized"] == 1 and "backward_holds" not in c  # one first call got through, then nothing


def test_the_logs_match_nothing_fatal_in_the_runs_that_completed() -> None:
    for case in ("guard", "module", "restart"):
        matcher = build_matcher(parse(json.loads((REAL / case / "watch.json").read_text())))
        hits = matcher.feed((REAL / case / "log").read_bytes()) + matcher.finish()
        assert [h.rule for h in hits if h.action == "abort"] == [], case
