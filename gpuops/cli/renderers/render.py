"""Renderers of core events: plain text or rich on a terminal, JSON lines with --json."""

from __future__ import annotations

import datetime as _dt
import json
import re
import sys
import time
from typing import Any, Callable, TextIO

from gpuops.agent.wire.jobwire import STORE_GONE
from gpuops.agent.wire.protocol import SCHEMA_VERSION
from gpuops.cli.renderers import style as looks
from gpuops.client.events import Event, Outcome

_LINE_BREAKS = ("\x85", "\u2028", "\u2029")
_LINE_END = re.compile(rb"\r\n|\r|\n")


def iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_line(obj: dict[str, Any], *, ensure_ascii: bool = True) -> str:
    """One JSON object of `--json` output, carrying its schema_version (the one place it is added)."""
    text = json.dumps({**obj, "schema_version": SCHEMA_VERSION}, ensure_ascii=ensure_ascii, default=str)
    # Line separators other than \n are legal raw inside JSON strings, but many line readers
    # (Python's splitlines, JavaScript) break lines there: escape them, so one event is one line.
    for sep in _LINE_BREAKS:
        text = text.replace(sep, f"\\u{ord(sep):04x}")
    return text


class JsonRenderer:
    """One JSON object per line on stdout, nothing else there; log bytes become `log` lines."""

    def __init__(self, out: TextIO | None = None, *, hold_summaries: bool = False) -> None:
        self.out = out or sys.stdout
        self._partial: dict[tuple[str, str | None], bytes] = {}
        self.target = ""
        self.runs: dict[str, str] = {}  # target -> its run: a summary names its own target's run
        #: Several targets: summaries wait, so the last lines are one per target (release()).
        self.held: list[dict[str, Any]] | None = [] if hold_summaries else None

    def emit(self, obj: dict[str, Any]) -> None:
        self.out.write(json_line(obj, ensure_ascii=False) + "\n")
        self.out.flush()

    def event(self, ev: Event) -> None:
        self.target = ev.target
        if ev.run:
            self.runs[ev.target] = ev.run
        base = {"ts": iso(ev.ts), "event": ev.kind, "target": ev.target}
        if ev.run:
            base["run"] = ev.run
        if ev.kind == "log":
            key = (ev.target, ev.run)
            data = self._partial.pop(key, b"") + ev.get("bytes", b"")
            # Lines end where the matcher ends them (\n, \r\n or a lone \r: a tqdm bar), so the n-th
            # `log` event of a run is the line a match's line_number counts. A CR at the very end
            # waits: the next bytes may make it a CRLF.
            lines = _LINE_END.split(data)
            rest = lines.pop()
            if data.endswith(b"\r") and lines:
                rest = lines.pop() + b"\r"
            if len(rest) > 65536:
                lines.append(rest)
                rest = b""
            if rest:
                self._partial[key] = rest
            for line in lines:
                self.emit({**base, "line": line.decode("utf-8", "replace")})
            return
        data = {k: v for k, v in ev.data.items() if not isinstance(v, bytes)}
        if ev.newer:  # a newer gpuops' record: its shape is not this schema's to vouch for, so it is data
            data, base["event"] = {"name": ev.kind if ev.kind != "watchdog" else data.get("what"), "record": data,
                                   "newer": True}, "unknown_event"
        self.emit({**base, **data})

    def outcome(self, out: Outcome, target: str | None = None) -> None:
        name = target or self.target
        for (tgt, run), rest in list(self._partial.items()):
            if self.held is not None and tgt != name:
                continue  # another target's line goes on
            text = rest[:-1] if rest.endswith(b"\r") else rest
            self.emit({"ts": iso(time.time()), "event": "log", "target": tgt, "run": run, "line": text.decode("utf-8", "replace")})
            del self._partial[(tgt, run)]
        obj: dict[str, Any] = {"ts": iso(time.time()), "event": "summary", "target": name}
        run = out.data.get("run") or self.runs.get(name)
        if run:
            obj["run"] = run
        obj.update({"outcome": out.outcome, "exit_code": out.exit_code, "message": out.message})
        obj.update({k: v for k, v in out.data.items() if k != "run"})
        if self.held is not None:
            self.held.append(obj)
            return
        self.emit(obj)

    def release(self, order: Callable[[dict[str, Any]], Any]) -> None:
        """The held summaries in `order` (the worst last, so the last line carries the command's exit code)."""
        held, self.held = self.held or [], None
        for obj in sorted(held, key=order):
            self.emit(obj)


def _who(by: Any) -> str:
    return {"watchdog": "the watchdog", "client": "gpuops", "stop": "gpuops stop", "timeout": "--timeout",
            "pane": "a Ctrl-C typed in the run's tmux pane"}.get(str(by), str(by))


def _seconds(value: Any) -> str:
    """10.0 as `10s`; a value of an older or newer record that is no number, as it is."""
    return f"{value:g}s" if isinstance(value, (int, float)) else f"{value}s"


def _last(text: Any) -> str:
    """A command's output, as one line: its last non-blank line."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


_WATCHDOG_WORDS: dict[str, Callable[[Event], str]] = {
    "watchdog_stale": lambda ev: (
        "the run's watchdog is not answering" + (f" (last heartbeat {ev.get('age')}s ago)" if ev.get("age") is not None else "")
        + "; gpuops watches the run from here until it is back"),
    "watchdog_back": lambda ev: "the run's watchdog answers again; it watches the run",
    "watchdog_restarted": lambda ev: (
        f"the watchdog died ({'signal ' + str(ev.get('signal')) if ev.get('signal') else 'exit ' + str(ev.get('exit'))}); "
        f"its supervisor started it again (restart {ev.get('restarts')})"),
    "watchdog_gave_up": lambda ev: f"the watchdog gave up: {ev.get('message')}",
    "abort_completed": lambda ev: f"the watchdog finished an abort its claimer did not ({ev.get('stopped_by')})",
    "session_gone": lambda ev: str(ev.get("message")),
    "stopped_elsewhere": lambda ev: f"the run is being stopped by {_who(ev.get('stopped_by'))} ({ev.get('reason')})",
    "note": lambda ev: f"note: {ev.get('message')}",
    "restart": lambda ev: (
        f"RESTART: attempt {ev.get('attempt')} of {ev.get('max_attempts')} after '{ev.get('after')}'"
        + (" with the compile guard" if ev.get("compile_guard") else "") + f", in {_seconds(ev.get('delay'))}"
        + (" after the warmup" if ev.get("warmup") else "") + " (the watchdog restarts training)"),
    "attempt_started": lambda ev: (
        f"attempt {ev.get('attempt')} of {ev.get('max_attempts')} started"
        + (" with the compile guard" if ev.get("compile_guard") else "")),
    "restart_cancelled": lambda ev: (
        f"attempt {ev.get('attempt')} will not start: the run was stopped by {_who(ev.get('stopped_by'))}"),
    "restart_failed": lambda ev: f"attempt {ev.get('attempt')} failed to start: {ev.get('message')}",
    "hardware": lambda ev: f"HARDWARE: {ev.get('message')}; {ev.get('advice')}",  # a stall or crash an Xid explains
    "gpu_health": lambda ev: f"{str(ev.get('verdict')).upper()}: GPU {ev.get('gpu')} ({ev.get('bus_id')}, {ev.get('uuid')}): "
    + "; ".join(f"{p.get('message')} ({p.get('counter')}): {p.get('action')}" for p in ev.get("problems") or []),
    "host_kernel_log": lambda ev: (
        f"the host's kernel log is followed for Xids on GPUs {ev.get('gpus')} ({ev.get('reader')}, host pid "
        f"{ev.get('host_pid')})" if ev.get("state") == "following" else
        f"the host's kernel log is not followed (Xids are not seen during the run): {ev.get('why')}"),
    "telemetry_problem": lambda ev: str(ev.get("message")),
    "notify_sent": lambda ev: (
        f"notified ({ev.get('what')}) through {ev.get('via')} channel {ev.get('channel')}: "
        + (f"HTTP {ev.get('status')}" if ev.get("status") is not None else
           f"exit {ev.get('exit')}" if ev.get("exit") is not None else "taken")
        + (f"; it printed: {_last(ev.get('output'))}" if ev.get("what") == "test" and _last(ev.get("output")) else "")),
    "notify_failed": lambda ev: (
        f"NOTIFICATION FAILED ({ev.get('what')}) through {ev.get('via') or 'a'} channel {ev.get('channel') or ''}: "
        f"{ev.get('reason')}"),
    "job_abort": lambda ev: (
        f"JOB: node {ev.get('first_node')} went away: its rendezvous store was lost before the job's end; this "
        "node stops too" if ev.get("first_by") == STORE_GONE else
        f"JOB: node {ev.get('first_node')} ended the job ({ev.get('first_reason')}"
        + (f", rule '{ev.get('rule')}'" if ev.get("rule") else "") + "): this node stops too"),
    "job_link": lambda ev: str(ev.get("message")),
    "rule_disabled": lambda ev: (
        f"rule '{ev.get('rule')}' took {ev.get('seconds')}s on one line (its pattern backtracks catastrophically): "
        "it is no longer applied; the other rules, the stall clock and --timeout go on"),
}


#: Control characters (C0 but tab and newline, DEL, C1) in gpuops' own words, e.g. a matched log line.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text for a terminal: a log line's NUL, bell or escape shown as \\xNN, never acted on by the terminal."""
    return _CONTROL.sub(lambda m: "\\x%02x" % ord(m.group(0)), text)


class TextRenderer:
    """Human output: log bytes as they are on stdout, gpuops' own words on stderr.

    multi (several targets at once): every log line is prefixed `target: ` and kept whole, the outcome
    lines carry `[target]`, and the warmup shows as plain lines (a progress bar per GPU index would mix targets).
    """

    def __init__(self, *, verbose: bool = False, multi: bool = False) -> None:
        self.verbose = verbose
        self.multi = multi
        self.err = sys.stderr
        self.tty = sys.stderr.isatty() and not multi
        self._progress: Any = None
        self._partial: dict[str, bytes] = {}  # multi: each target's unfinished log line
        self._no_smi: set[str] = set()  # targets whose preflight found no nvidia-smi (said there, once)

    def say(self, text: str) -> None:
        text = printable(text)
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False, emoji=False)
            return
        self.err.write(text + "\n")
        self.err.flush()

    def event(self, ev: Event) -> None:
        if not ev.newer:
            self._event(ev)
            return
        try:  # a newer gpuops' record: shown as its kind is, or as recorded where its shape is not what we know
            self._event(ev)
        except Exception:  # noqa: BLE001 - an unknown shape is data, never a crash
            self.say(f"[{ev.target}] {ev.kind}: {ev.data}")

    def _event(self, ev: Event) -> None:
        k = ev.kind
        tag = f"[{ev.target}]"
        if looks.QUIET and k != "log":  # -q: the outcome and errors only (the log's bytes are the command's output)
            return
        if k == "log":
            data = ev.get("bytes", b"")
            sys.stdout.buffer.write(self._prefixed(ev.target, data) if self.multi else data)
            sys.stdout.buffer.flush()
        elif k == "preflight_ok":
            gpus = ", ".join(f"{g['index']}: {g['memory_used_mib']} MiB {g['utilization_pct']}%" for g in ev.get("gpus", []))
            absent = ev.get("smi") == "absent"  # a machine without NVIDIA tools (the local demo): said here, once
            if absent:
                self._no_smi.add(ev.target or "")
            self.say(f"{tag} preflight ok" + (f" (GPU {gpus})" if gpus else "")
                     + ("; no nvidia-smi here, so no GPU telemetry" if absent else ""))
        elif k == "lock_recovered":
            self.say(f"{tag} recovered the launch lock left by a launcher that died: {ev.get('holder')}")
        elif k == "run_created":
            self.say(f"{tag} run {ev.run}")
        elif k.startswith("warmup"):
            self._warmup(ev)
        elif k == "started":
            self._stop_progress()
            self.say(f"{tag} started run {ev.run} in tmux session '{ev.get('session')}' (log {ev.get('log')})")
        elif k == "match":
            where = f"at log line {ev.get('line_number')}" if ev.get("line_number") else "(from outside the log)"
            self.say(f"{tag} {str(ev.get('action')).upper()}: rule '{ev.get('rule')}' matched {where}: "
                     f"{ev.get('line') or ev.get('message')}")
            pad = f"{tag}     " if self.multi else "    "  # several targets: every line says whose it is
            if ev.get("advice"):
                self.say(f"{pad}{ev.get('advice')}")
            if ev.get("action") == "abort" and ev.get("excerpt"):
                self.say("\n".join(f"{pad}| " + ln for ln in str(ev.get("excerpt", "")).splitlines()))
        elif ((k if k != "watchdog" else ev.get("what")) == "telemetry_problem" and (ev.target or "") in self._no_smi
              and "nvidia-smi cannot run" in str(ev.get("message"))):
            return  # the preflight line said it
        elif k in _WATCHDOG_WORDS:
            self.say(f"{tag} " + _WATCHDOG_WORDS[k](ev))
        elif k == "watchdog" and ev.get("what") in _WATCHDOG_WORDS:
            self.say(f"{tag} " + _WATCHDOG_WORDS[str(ev.get("what"))](ev))
        elif k == "log_missing":
            self.say(f"{tag} the run's log {ev.get('log')} is missing (deleted?): no output can be seen")
        elif k == "stall":
            self.say(f"{tag} STALL: no log output for {ev.get('seconds')}s (stall_timeout {ev.get('stall_timeout')}s)")
        elif k == "abort_start":
            by = f"; by {_who(ev.get('by'))}" if ev.get("by") else ""
            self.say(f"{tag} aborting run {ev.run} ({ev.get('reason')}{by}): signal, grace, kill session, reap processes")
        elif k == "aborted":
            gpus = ", ".join(f"{g['index']}: {g['memory_used_mib']} MiB" for g in ev.get("gpus", []))
            stacks = [st for st in ev.get("stacks") or [] if st.get("file")]
            self.say(f"{tag} run {ev.run} stopped in {ev.get('seconds')}s; session gone" + (f"; GPUs {gpus}" if gpus else "")
                     + (f"; stacks of {len(stacks)} Python process(es) recorded (gpuops logs --stacks)" if stacks else "")
                     + (f"; SURVIVORS {ev.get('survivors')}" if ev.get("survivors") else "")
                     + "".join(f"; GPU {g} DID NOT DRAIN (held by pids {held or 'not listed'})"
                               for g, held in (ev.get("held_by") or {}).items()))
            if (ev.get("hang") or {}).get("text"):
                self.say(f"{tag} WHERE THE JOB HUNG: {ev.get('hang')['text']}")
        elif k == "stacks":
            self._stacks(ev, tag)
        elif k == "job_planned":
            self.say(f"job {ev.run}: {len(ev.get('nodes') or [])} nodes {', '.join(ev.get('nodes') or [])}; "
                     f"rendezvous at {ev.get('rdzv_endpoint')} (found by {ev.get('found_by')})")
        elif k == "waiting_start":
            self.say(f"{tag} run {ev.run} is being launched ({ev.get('phase')}); following once training starts")
        elif k == "reconnecting":
            self.say(f"{tag} connection lost ({ev.get('error')}); reconnecting (attempt {ev.get('attempt')})")
        elif k == "reconnected":
            self.say(f"{tag} reconnected; resuming at byte {ev.get('offset')}")
        elif k == "survivors":
            self.say(f"{tag} processes of the run survived SIGKILL: {ev.get('pids')}")
        elif k == "timeout":
            self.say(f"{tag} --timeout ran out; stopping run {ev.run}")
        elif k == "newer_run":
            self.say(f"{tag} run {ev.run} was written by a newer gpuops (its records are version {ev.get('version')}, "
                     f"this gpuops knows {ev.get('this_version')}): what this one does not know is shown as recorded "
                     "or left out; update gpuops to see all of it")
        elif k == "unknown_event" and self.verbose:
            self.say(f"{tag} the run recorded '{ev.get('name')}', which this gpuops does not know: {ev.get('record')}")
        elif self.verbose:
            self.say(f"{tag} {k} {ev.data}")

    def _stacks(self, ev: Event, tag: str) -> None:
        """One process's threads on stdout (they are what the command prints): a head line, then py-spy's or
        faulthandler's own text, as kept on the target."""
        attempt = f" of attempt {ev.get('attempt')}" if ev.get("attempt") else ""
        rank = f" (rank {ev.get('rank')})" if ev.get("rank") is not None else ""
        if not ev.get("file"):
            lines = [f"{tag} pid {ev.get('pid')}{rank}{attempt}: no stacks ({ev.get('error') or 'no answer'})"]
        else:
            pad = f"{tag} " if self.multi else ""
            lines = [f"{tag} pid {ev.get('pid')}{rank}{attempt}: {ev.get('threads')} thread(s) via {ev.get('via')} "
                     f"({ev.get('file')} in the run directory)"]
            lines += [pad + line for line in str(ev.get("text") or "").splitlines() if not line.startswith("#")]
        sys.stdout.write("".join(printable(line) + "\n" for line in lines))
        sys.stdout.flush()

    def _warmup(self, ev: Event) -> None:
        gpu = ev.get("gpu")
        if not self.tty:
            if ev.kind == "warmup_output":
                self.say(f"[{ev.target} warmup gpu{gpu}] {ev.get('line')}")
            elif ev.kind == "warmup_start":
                self.say(f"[{ev.target}] warmup on GPU {gpu}")
            elif ev.kind == "warmup_done":
                self.say(f"[{ev.target}] warmup on GPU {gpu} done in {ev.get('seconds')}s")
            elif ev.kind == "warmup_draining":
                self.say(f"[{ev.target}] waiting for GPU {gpu} memory to drain ({ev.get('memory_used_mib')} MiB)")
            return
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        if self._progress is None:
            # markup=False: a warmup line is shown as printed (`[rank0]: ...` is no style tag, `:fire:` no emoji).
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                                      TimeElapsedColumn(), TextColumn("{task.fields[last]}", markup=False),
                                      console=looks.console(), transient=False)
            self._progress.start()
            self._tasks: dict[int, Any] = {}
        p = self._progress
        if ev.kind == "warmup_start":
            self._tasks[gpu] = p.add_task(f"warmup GPU {gpu}", total=None, last="")
        elif ev.kind == "warmup_output" and gpu in self._tasks:
            p.update(self._tasks[gpu], last=str(ev.get("line"))[-80:])
        elif ev.kind == "warmup_draining" and gpu in self._tasks:
            p.update(self._tasks[gpu], last=f"draining ({ev.get('memory_used_mib')} MiB)")
        elif ev.kind == "warmup_done" and gpu in self._tasks:
            p.update(self._tasks[gpu], total=1, completed=1, last=f"done in {ev.get('seconds')}s")
            p.stop_task(self._tasks[gpu])

    def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _prefixed(self, target: str, data: bytes) -> bytes:
        """Whole log lines, each after `target: `; a line's end (\\n, \\r\\n, a tqdm bar's \\r) is kept as it is."""
        data = self._partial.pop(target, b"") + data
        prefix = f"{target}: ".encode()
        out, start = [], 0
        for m in _LINE_END.finditer(data):
            if m.end() == len(data) and m.group() == b"\r":
                break  # a CR at the very end waits: the next bytes may make it a CRLF
            out.append(prefix + data[start:m.end()])
            start = m.end()
        rest = data[start:]
        if len(rest) > 65536:  # no line end in sight: show it rather than hold it
            out.append(prefix + rest + b"\n")
            rest = b""
        if rest:
            self._partial[target] = rest
        return b"".join(out)

    def end_log(self, target: str) -> None:
        """The target's last log line, when it ended without a line break."""
        rest = self._partial.pop(target, b"")
        if rest:
            sys.stdout.buffer.write(f"{target}: ".encode() + rest + (b"" if rest.endswith(b"\n") else b"\n"))
            sys.stdout.buffer.flush()

    def outcome(self, out: Outcome, target: str | None = None) -> None:
        self._stop_progress()
        if self.multi:
            self.end_log(target or "")
            if out.message:
                word = out.outcome if out.exit_code == 0 else out.outcome.upper()
                self.say(f"[{target}] {word} (exit {out.exit_code}): {out.message}")
            return
        if out.message:
            prefix = "gpuops: " if out.exit_code == 0 else f"gpuops: {out.outcome.upper()} (exit {out.exit_code}): "
            self.say(prefix + out.message)

    def error(self, target: str, code: int, message: str, hint: str | None, exc: BaseException | None) -> None:
        """multi: a target's error, every line tagged with the target (the others go on)."""
        from gpuops.cli.renderers.errors_view import error_text

        self.end_log(target)
        text = error_text(message, hint, exc, head=f"ERROR (exit {code}): ")
        self.say("\n".join(f"[{target}] {line}" for line in text.rstrip("\n").split("\n")))
