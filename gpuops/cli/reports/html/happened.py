"""The report's "What happened" table in words a person reads: each watchdog event's detail said as a
sentence, never a Python value (no dict, list, None or True reprs); an event this gpuops does not know
(a newer agent's) is shown with its fields said the same way."""

from __future__ import annotations

import math
from typing import Any, Callable

#: Who stopped a run, as abort.json's `by` and the events' `stopped_by` name them.
WHO = {"watchdog": "the watchdog", "client": "gpuops", "stop": "gpuops stop", "timeout": "--timeout",
       "pane": "a Ctrl-C typed in the run's tmux pane", "job": "another node of the job"}
#: Why a run was stopped, as the events' `reason` names it.
WHY = {"stall": "a stall", "match": "a rule matched", "stop": "gpuops stop", "timeout": "--timeout ran out",
       "pane": "a Ctrl-C in the pane", "job": "another node ended the job", "interrupt": "Ctrl-C"}
#: Fields said elsewhere in the report, or of no use to a reader.
HIDDEN = ("event", "ts", "schema_version", "by", "gpus", "advice", "stacks", "figures", "previous", "time",
          "session_gone_at",
          "hang", "verdict_pending")


def number(value: Any) -> str:
    """A figure as a person writes it: 60, 2.649, 1.7e+308, inf."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) or math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int):
        return str(value) if abs(value) < 10 ** 30 else f"a {value.bit_length()}-bit number"
    return str(value)


def words(value: Any) -> str:
    """Any decoded JSON value as words: none, yes/no, figures, `key value` pairs, comma lists."""
    if value is None:
        return "none"
    if isinstance(value, (bool, int, float)):
        return number(value)
    if isinstance(value, dict):
        return "; ".join(f"{str(k).replace('_', ' ')} {words(v)}" for k, v in value.items()) or "nothing"
    if isinstance(value, (list, tuple)):
        return ", ".join(words(v) for v in value) or "none"
    return str(value)


def who(by: Any) -> str:
    return WHO.get(str(by), str(by)) if by else "someone"


def why(reason: Any, rule: Any = None) -> str:
    said = WHY.get(str(reason), str(reason)) if reason else "no reason recorded"
    return said + (f" (rule {rule})" if rule else "")


def seconds(value: Any) -> str:
    return f"{number(value)} s" if isinstance(value, (int, float)) and not isinstance(value, bool) else "? s"


def _stall(ev: dict[str, Any]) -> str:
    said = f"no new output for {seconds(ev.get('seconds'))} (stall timeout {seconds(ev.get('stall_timeout'))}"
    clock = c if isinstance(c := ev.get("stall"), dict) else {}
    if clock.get("mode") == "auto":
        gaps = clock.get("gaps")
        said += (f", learned from {number(gaps)} gaps between the log's lines" if clock.get("learned")
                 else ", auto: not yet learned, the initial timeout")
    said += ")"
    if ev.get("log_missing"):
        said += "; the log file is missing"
    return said


def _aborted(ev: dict[str, Any]) -> str:
    survivors = ev.get("survivors") or []
    said = f"stopped in {seconds(ev.get('seconds'))}; survivors: " + (words(survivors) if survivors else "none")
    stacks = s if isinstance(s := ev.get("stacks"), list) else []
    taken = [s for s in stacks if isinstance(s, dict) and s.get("file")]
    if stacks:
        said += f"; stacks of {len(taken)} of {len(stacks)} processes taken before the signal"
    if ev.get("held_by"):
        said += f"; GPUs still held by {words(ev.get('held_by'))}"
    if isinstance(ev.get("hang"), dict) and ev["hang"].get("text"):
        said += f"; the job hung: {words(ev['hang']['text'])}"
    return said


def _restart(ev: dict[str, Any]) -> str:
    return (f"attempt {number(ev.get('attempt'))} of {number(ev.get('max_attempts'))} after {why(ev.get('after'))}"
            + (", with the compile guard" if ev.get("compile_guard") else "")
            + (f", in {seconds(ev.get('delay'))}" if isinstance(ev.get("delay"), (int, float)) else "")
            + (" after a warmup" if ev.get("warmup") else ""))


DETAILS: dict[str, Callable[[dict[str, Any]], str]] = {
    "match": lambda ev: (f"{'warning' if ev.get('action') == 'warn' else ev.get('action') or 'match'}: "
                         f"rule {ev.get('rule') or 'unnamed'}: {ev.get('line') or ev.get('description') or ''}"),
    "note": lambda ev: str(ev.get("message") or ""),
    "stall": _stall,
    "abort_start": lambda ev: f"stopping the run after {why(ev.get('reason'), ev.get('rule'))}",
    "aborted": _aborted,
    "abort_completed": lambda ev: f"{ev.get('message') or 'the watchdog finished the abort'} ({who(ev.get('stopped_by'))})",
    "stopped_elsewhere": lambda ev: f"stopped by {who(ev.get('stopped_by'))} after {why(ev.get('reason'), ev.get('rule'))}",
    "restart": _restart,
    "attempt_started": lambda ev: (f"attempt {number(ev.get('attempt'))} of {number(ev.get('max_attempts'))} started"
                                   + (" with the compile guard" if ev.get("compile_guard") else "")),
    "restart_failed": lambda ev: f"attempt {number(ev.get('attempt'))} could not start: {ev.get('message') or 'no reason said'}",
    "hardware": lambda ev: f"{ev.get('message') or 'a GPU of the run failed'}; {ev.get('advice') or ''}".rstrip("; "),
    "restart_cancelled": lambda ev: (f"attempt {number(ev.get('attempt'))} will not start: the run was stopped by "
                                     f"{who(ev.get('stopped_by'))}"),
    "session_gone": lambda ev: str(ev.get("message") or "the run's tmux session is gone"),
    "done": lambda ev: "the watchdog finished watching the run",
    "events_left_out": lambda ev: f"{number(ev.get('count'))} more events are in events.jsonl",
}


def detail(ev: dict[str, Any]) -> str:
    """One event's detail column."""
    said = DETAILS.get(str(ev.get("event")))
    if said is not None:
        return said(ev)
    return words({k: v for k, v in ev.items() if k not in HIDDEN})


def name(ev: dict[str, Any]) -> str:
    """The event column: its documented name in words (abort_start: abort start)."""
    return str(ev.get("event") or "event").replace("_", " ")
