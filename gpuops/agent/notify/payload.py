"""What a notification says: one JSON object (in `gpuops schema`, `event: "notify"`) and a line a person reads."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

from ..wire import protocol as p
from ..wire.records import command_exit_code, outcome, read_json, read_text
from ..wire.verdict import record_view, record_words
from ..wire.watchfile import WatchConfig
from .said import clean

#: The events a channel may be told of (playbook `notify[].on`), and the default (both sides read them in the wire).
WHATS, DEFAULT_ON = p.NOTIFY_WHATS, p.NOTIFY_DEFAULT_ON
TEST = p.NOTIFY_TEST  # `gpuops notify-test`
#: The watchdog's events that make a notification (events.jsonl `event` -> `what`). `restarted` is told when
#: the next attempt has started (not when its delay begins: a stop in the delay, or a GPU taken, means none).
FROM_EVENT = {"abort_start": "aborted", "stopped_elsewhere": "aborted", "attempt_started": "restarted",
              "done": "ended", "match": "warned", "stall": "stalled"}
EXCERPT_LIMIT = 4000
#: Who stopped a run (abort.json `by`), in words.
BY = {"watchdog": "the watchdog", "client": "a following gpuops", "stop": "gpuops stop", "timeout": "--timeout"}
LINE_LIMIT = 200


def what_of(event: str, data: Dict[str, Any]) -> Optional[str]:
    """The notification an event of the run makes, if any (a match makes one only when it warns). A stalled
    torchrun job's `aborted` is told once its sequence ended (the `aborted` event), with where the job hung."""
    if data.get("verdict_pending"):
        return "aborted" if event == "aborted" else None if event == "abort_start" else FROM_EVENT.get(event)
    what = FROM_EVENT.get(event)
    if what == "warned" and data.get("action") != "warn":
        return None
    return what


def key_of(what: str, attempt: int, rule: Optional[str]) -> str:
    """One notification per (what, attempt); a warning per rule and attempt. Safe as a file name."""
    parts = [what, str(attempt)] + ([rule] if what == "warned" and rule else [])
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in "-".join(parts))[:120]


def build(d: str, cfg: WatchConfig, what: str, data: Dict[str, Any]) -> Dict[str, Any]:
    """The payload of `what` for the run in `d`, from its records now and the event's own fields."""
    meta = read_json(os.path.join(d, p.META)) or {}
    rec = read_json(os.path.join(d, p.ATTEMPT)) or {}
    attempt = int(rec.get("attempt") or 1) if isinstance(rec.get("attempt"), int) else 1
    max_attempts = cfg.max_attempts
    abort = read_json(os.path.join(d, p.ABORT))
    exit_text = read_text(os.path.join(d, p.EXIT_CODE))
    hardware = read_json(os.path.join(d, p.HARDWARE))
    rule = data.get("rule") or (abort or {}).get("rule")
    excerpt = (abort or {}).get("excerpt") or data.get("excerpt")
    facts: Dict[str, Any] = {"by": (abort or {}).get("by") or data.get("stopped_by")}
    if hardware is not None and what in ("aborted", "ended", "stalled"):  # the GPU that failed, and what to do
        facts["hardware"] = record_view(hardware)
    if what in ("aborted", "ended"):  # the threads' stacks taken before the abort's signal, once it finished
        done = read_json(os.path.join(d, p.ABORT_DONE)) or {}
        facts["stacks"] = done.get("stacks")
        facts["hang"] = data.get("hang") or done.get("hang")  # a stalled torchrun job: where it hung
    if what == "aborted":
        name, code = outcome(None, abort or {"reason": data.get("reason")}, True, hardware)
        restarting = _restart_due(d, cfg)
        facts["restart_due"] = restarting
    elif what == "stalled":
        name, code = p.RunState.STALLED, p.ExitCode.STALLED
        excerpt = data.get("last_line") or (abort or {}).get("last_line")
    elif what == "restarted":
        attempt = int(data.get("attempt") or attempt)
        prev = data.get("previous") or read_json(os.path.join(p.attempt_dir(d, attempt - 1), p.ATTEMPT)) or {}
        name, code = p.RunState.RUNNING, None
        rule = data.get("after") or rec.get("after") or prev.get("rule") or rule
        excerpt = prev.get("excerpt") or excerpt
    elif what == "ended":
        name, code = outcome(exit_text, abort, False, hardware)
        facts["command_exit_code"] = command_exit_code(exit_text)
        facts["restart_failed"] = _restart_failed(rec, abort) or (hardware or {}).get("restart_blocked")
        if abort is None:
            rule, excerpt = None, None
        if hardware is not None:
            rule = hardware.get("rule") or rule
    else:  # warned
        name, code = p.RunState.RUNNING, None
        excerpt = data.get("excerpt") or data.get("line")
    payload = {"event": "notify", "what": what, "run": os.path.basename(d), "target": str(meta.get("target") or "?"),
               "playbook": str(meta.get("playbook") or cfg.playbook or "?"), "outcome": str(name),
               "exit_code": code, "rule": rule, "excerpt": _cut(excerpt, EXCERPT_LIMIT), "attempt": attempt,
               "max_attempts": max_attempts, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "schema_version": p.SCHEMA_VERSION}
    payload.update({k: v for k, v in facts.items() if v is not None})
    payload["text"] = text(payload, line=data.get("line"))
    payload.pop("restart_due", None)
    return payload


def test_payload(run: str, target: str, playbook: str) -> Dict[str, Any]:
    """What `gpuops notify-test` sends through every channel."""
    payload = {"event": "notify", "what": TEST, "run": run, "target": target, "playbook": playbook,
               "outcome": "test", "exit_code": None, "rule": None, "excerpt": None, "attempt": 1, "max_attempts": 1,
               "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "schema_version": p.SCHEMA_VERSION}
    payload["text"] = text(payload)
    return payload


def _restart_failed(rec: Dict[str, Any], abort: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why the attempt the run waited for never ran (attempt.json): it could not start, or a stop came first."""
    n = rec.get("attempt")
    if rec.get("start_failed"):
        return "attempt %s could not start: %s" % (n, rec["start_failed"])
    if rec.get("state") == p.ATTEMPT_STOPPED:
        by = BY.get(str((abort or {}).get("by")), (abort or {}).get("by") or "a stop")
        return "attempt %s never started: the run was stopped by %s while it waited" % (n, by)
    return None


def _restart_due(d: str, cfg: WatchConfig) -> bool:
    from ..run.attempt import due

    try:
        return due(d, cfg) is not None
    except (OSError, ValueError, TypeError):
        return False


def _cut(value: Any, limit: int) -> Optional[str]:
    if value is None:
        return None
    value = str(value)
    return value if len(value) <= limit else value[-limit:]


def _first_line(value: Any) -> str:
    """The line that says it: the excerpt's last non-blank line (a traceback ends with the error)."""
    lines = [x.strip() for x in str(value or "").splitlines() if x.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= LINE_LIMIT else line[:LINE_LIMIT - 3] + "..."


def _hang_words(payload: Dict[str, Any]) -> str:
    """Where a stalled torchrun job hung (wire/hang.py's verdict), for the one line."""
    said = (payload.get("hang") or {}).get("text")
    return "; the job hung: %s" % said if said else ""


def text(payload: Dict[str, Any], line: Any = None) -> str:
    """One line: what happened, where, what to do; a control character of the log (a NUL, an escape) as \\xNN."""
    return clean(_text(payload, line))


def _text(payload: Dict[str, Any], line: Any) -> str:
    run, what = payload["run"], payload["what"]
    where = "run %s (%s) on %s" % (run, payload["playbook"], payload["target"])
    look = "gpuops logs --run %s -t %s" % (run, payload["target"])
    attempt = ("attempt %s of %s" % (payload["attempt"], payload["max_attempts"])) if payload["max_attempts"] > 1 else ""
    said = _first_line(line or payload.get("excerpt"))
    rule = payload.get("rule")
    if payload.get("hardware") and what in ("aborted", "ended"):  # the GPU, the Xid or counter, NVIDIA's action
        said = record_words(payload["hardware"])
        if what == "ended":
            failed = ": " + payload["restart_failed"] if payload.get("restart_failed") else ""
            return "gpuops: %s ENDED BY ITS HARDWARE (exit %s): %s%s; see: %s" % (
                where, payload["exit_code"], said, failed, look)
    if what == "aborted":
        why = "rule '%s' matched" % rule if rule and payload["outcome"] in ("aborted", "hardware") else payload["outcome"]
        by = BY.get(str(payload.get("by")), payload.get("by"))
        head = "gpuops: %s ABORTED%s: %s%s" % (where, " by " + str(by) if by else "", why, ": " + said if said else "")
        head += _hang_words(payload)
        then = ("the watchdog restarts it (%s)" % attempt) if payload.get("restart_due") else "see why: " + look
        return "%s; %s" % (head, then)
    if what == "stalled":
        return "gpuops: %s STALLED (no log output); it is being stopped%s; see: %s" % (
            where, " (last line: %s)" % said if said else "", look)
    if what == "restarted":
        return "gpuops: %s RESTARTED after '%s' (%s); follow it: gpuops logs -f -t %s" % (
            where, rule, attempt or "attempt %s" % payload["attempt"], payload["target"])
    if what == "ended":
        ok = payload["exit_code"] == 0
        how = "SUCCEEDED (exit 0)" if ok else "ENDED: %s, exit %s" % (payload["outcome"], payload["exit_code"])
        extra = (", rule '%s'" % rule) if rule and not ok else ""
        failed = ": " + payload["restart_failed"] if payload.get("restart_failed") else ""
        tail = "" if ok else "; see why: " + look
        return "gpuops: %s %s%s%s%s%s%s" % (where, how, extra, " (%s)" % attempt if attempt else "", failed,
                                            _hang_words(payload), tail)
    if what == "warned":
        return "gpuops: %s WARNING: rule '%s'%s; the run goes on; see: %s" % (where, rule, ": " + said if said else "",
                                                                            look)
    return "gpuops: test notification for %s: this channel works" % where
