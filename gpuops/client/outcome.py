"""How a followed run ended, read from its records on the target, whoever stopped it.

The outcome and exit code come from gpuops.agent.wire.records.outcome, the mapping the watchdog,
`status` and `runs` use too; this module only words it.
"""

from __future__ import annotations

import re
from typing import Any

from gpuops.agent.wire.records import outcome as record_outcome
from gpuops.agent.wire.verdict import record_view, record_words
from gpuops.client.events import Outcome
from gpuops.client.play import Play
from gpuops.errors import ExitCode

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_SIGNALS = {129: "SIGHUP: its tmux session was killed", 130: "SIGINT", 137: "SIGKILL", 139: "SIGSEGV", 143: "SIGTERM"}
_WHO = {"watchdog": "the watchdog", "client": "gpuops", "stop": "`gpuops stop`", "timeout": "--timeout",
        "pane": "a Ctrl-C typed in its tmux pane"}


def last_line(tail: bytes, play: Play) -> str | None:
    """The log's last non-blank line, colours removed, secrets masked before the cut to 300 characters."""
    for raw in reversed(tail.replace(b"\r", b"\n").split(b"\n")):
        text = _ANSI.sub("", raw.decode("utf-8", "replace")).strip()
        if text:
            return play.masker.cut(text, 300, keep_end=True)
    return None


def session_state(play: Play) -> Any:
    """The playbook's session on the target and its current run, as the probe reads them."""
    return play.door.probe((play.session,)).sessions.get(play.session)


def run_info(play: Play, run_id: str) -> Any:
    """The run's records (None when the session now points at another run)."""
    state = session_state(play)
    return state.run if state and state.run and state.run.run_id == run_id else None


def ended_outcome(play: Play, run_id: str, ev: Any, *, first_abort: Any = None, abort_on_match: bool = True,
                  last: str | None = None, container: str | None = None) -> Outcome:
    if container is not None:
        what = "stopped" if container == "stopped" else "no longer exists"
        return Outcome("lost", ExitCode.TRAINING_FAILED,
                       f"run {run_id} is lost: container {play.target.ctid} {what} while it ran "
                       "(its tmux session and every process of the run went with it)", {"run": run_id, "container": container})
    info = run_info(play, run_id)
    said = {"last_line": last} if last else {}
    how = _badly(info, ev)
    if how is not None and info is not None and info.hardware is None:  # an Xid the follower did not hand over?
        from gpuops.client.gpu_health import explain_end

        info.hardware = explain_end(play, run_id, info, how)
    if info is not None and info.outcome_code() == ExitCode.HARDWARE and info.hardware is not None:
        return _hardware(run_id, info, said)
    if info is not None and info.abort is not None:
        return _stopped(run_id, info, play, said)
    if first_abort is not None and not abort_on_match:
        rule = _get(first_abort, "rule")
        return Outcome("matched", ExitCode.ABORTED, f"run {run_id} ended; rule '{rule}' matched (not aborted: --no-abort)",
                       {"run": run_id, "rule": rule, "excerpt": _get(first_abort, "excerpt")})
    code = ev.code if ev is not None else None
    if code is None and info is not None:
        code = info.exit_code
    tail = f"; last log line: {last}" if last else ""
    if ev is None or ev.how == "gone" or code is None:
        return Outcome("lost", ExitCode.TRAINING_FAILED,
                       f"run {run_id} ended without an exit code: its tmux session is gone (killed by hand, or the container "
                       f"stopped){tail}", {"run": run_id, **said})
    if code == 0:
        return Outcome("succeeded", ExitCode.OK, f"run {run_id} finished with exit code 0", {"run": run_id, "command_exit_code": 0})
    note = f" ({_SIGNALS[code]})" if code in _SIGNALS else ""
    return Outcome("failed", ExitCode.TRAINING_FAILED, f"run {run_id}: training exited with code {code}{note}{tail}",
                   {"run": run_id, "command_exit_code": code, **said})


def _stopped(run_id: str, info: Any, play: Play, said: dict[str, Any]) -> Outcome:
    """A run that was stopped: the abort record says why, and by whom."""
    record = info.abort
    name, code = record_outcome(None if info.exit_code is None else str(info.exit_code), record, info.session_alive)
    reason, rule, by = record.get("reason"), record.get("rule"), record.get("by")
    who = _WHO.get(str(by), str(by or "someone"))
    done = info.abort_done or {}
    data = {"run": run_id, "rule": rule if reason not in ("stall", "stop", "timeout", "interrupt") else (rule or reason),
            "line": record.get("line"), "excerpt": record.get("excerpt"), "by": by, "gpus": done.get("gpus", []),
            "survivors": done.get("survivors", []), **({"stacks": done["stacks"]} if done.get("stacks") else {})}
    if reason == "stall":
        last = record.get("last_line")  # the line before the stall, not what the run printed when stopped
        limit = record.get("stall_timeout", play.playbook.watch.stall_timeout)
        message = (f"run {run_id} stalled: no log output for {record.get('seconds')}s (stall_timeout {limit:g}s"
                   + ("; its log file is missing" if record.get("log_missing") else "") + f"); stopped by {who}"
                   + (f"; last log line: {last}" if last else "; it had printed nothing"))
        data.update(rule="stall", last_line=last)
    elif reason == "timeout":
        message = f"--timeout ran out: run {run_id} stopped"
    elif reason == "stop":
        message = f"run {run_id} was stopped by `gpuops stop`"
    elif reason == "job":  # another node of a torchrun job ended it: that node's cause
        first = record.get("first_reason")
        what = {"stall": "stalled", "match": f"matched {rule}", "failed": "failed"}.get(str(first), str(first))
        message = (f"run {run_id} stopped with its torchrun job: node {record.get('first_node')} (rank "
                   f"{record.get('first_rank')}) {what} first; stopped by {who}")
        if first == "stall":
            data.update(rule="stall")
    elif reason == "interrupt":
        message = (f"run {run_id} was interrupted by {who} (the training exited with code "
                   f"{record.get('command_exit_code')}); the run is over: its session is gone, nothing of it is left")
    else:
        message = f"run {run_id} aborted: rule '{rule}' matched (stopped by {who}): {record.get('line')}"
    hang = done.get("hang") if isinstance(done.get("hang"), dict) else None
    if hang is not None:  # a stalled torchrun job: where it hung, as every node read it
        data["hang"] = hang
        message += f"; the job hung: {hang.get('text')}"
    rows = [st for st in done.get("stacks") or [] if isinstance(st, dict)]
    kept = [st for st in rows if st.get("file")]
    if kept:
        message += f"; thread stacks of {len(kept)} Python process(es) recorded before the signal (gpuops logs --stacks)"
    message += "".join(f"; no stacks of pid {st.get('pid')} ({st.get('error') or 'no answer'})" for st in rows if not st.get("file"))
    return Outcome(name, code if code is not None else ExitCode.ABORTED, message, data)


def _badly(info: Any, ev: Any) -> str | None:
    """How a run ended that an Xid may explain: a stall, a crash (failed) or a lost session; None otherwise."""
    if info is None:
        return None
    if info.abort is not None:
        return "stall" if info.abort.get("reason") == "stall" else None
    code = ev.code if ev is not None and ev.code is not None else info.exit_code
    if ev is None or ev.how == "gone" or code is None:
        return "lost"
    return "failed" if code != 0 else None


def _hardware(run_id: str, info: Any, said: dict[str, Any]) -> Outcome:
    """A run its GPU ended: which GPU, the Xid or counter, NVIDIA's action (hardware.json)."""
    record = info.hardware
    view = record_view(record)
    instead = {"stall": "; it looked like a stall", "failed": "; the training crashed with it",
               "lost": "; its session went with it"}.get(str(view.get("instead_of")), "")
    blocked = f"; {view['restart_blocked']}" if view.get("restart_blocked") else ""
    abort = info.abort or {}
    done = info.abort_done or {}
    data = {"run": run_id, "rule": view.get("rule"), "hardware": view, "by": abort.get("by"),
            "line": abort.get("line"), "excerpt": abort.get("excerpt"), **said,
            **({"command_exit_code": info.exit_code} if info.exit_code is not None else {}),
            **({"stacks": done["stacks"]} if done.get("stacks") else {})}
    return Outcome("hardware", ExitCode.HARDWARE,
                   f"run {run_id} ended by its hardware: {record_words(record)}{instead}{blocked}", data)


def _get(hit: Any, key: str) -> Any:
    return hit.get(key) if isinstance(hit, dict) else getattr(hit, key, None)
