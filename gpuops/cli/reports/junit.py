"""`--junit PATH`: a JUnit XML report for CI test pages, recorded from what the renderer is shown.

The recorder sits beside the renderer: it sees the same events and the same Outcome, plus the
errors that go on to the CLI boundary, so the report and the terminal never disagree. One
testsuite per target; testcases `preflight`, `warmup GPU <n>` (one per warmup GPU) and `training`;
a run the watchdog restarted has one `training (attempt <n>)` testcase per attempt.
"""

from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from gpuops.cli.reports.writable import check_writable
from gpuops.client.events import Event, Outcome
from gpuops.errors import ExitCode, GpuopsError

if TYPE_CHECKING:
    from types import TracebackType

    from gpuops.cli.roles import Render
    from gpuops.client.play import Play

LOG_TAIL_BYTES = 128 * 1024
LOG_TAIL_LINES = 200  # the end of the training log, in the training testcase's system-out
OUTPUT_LINES = 50  # per testcase, gpuops' own notes and the warmup's output
FAILED = {ExitCode.PREFLIGHT, ExitCode.WARMUP, ExitCode.TRAINING_FAILED, ExitCode.ABORTED, ExitCode.STALLED,
          ExitCode.TIMEOUT}  # fmt: skip
ERROR_TYPES = {ExitCode.INTERNAL: "internal-error", ExitCode.USAGE: "usage-error", ExitCode.CONNECT: "connect-error",
               ExitCode.PREFLIGHT: "preflight-failed", ExitCode.WARMUP: "warmup-failed",
               ExitCode.TRAINING_FAILED: "training-failed"}  # fmt: skip
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass
class Case:
    """One testcase: pending until an event or the outcome decides it."""

    name: str
    status: str = "pending"  # pending | running | passed | failure | error | skipped
    started: float | None = None
    seconds: float = 0.0
    type: str = ""
    message: str = ""
    detail: str = ""
    out: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.out.append(line)
        del self.out[:-OUTPUT_LINES]

    def finish(self, status: str, now: float, **fields: Any) -> None:
        if self.started is not None:
            self.seconds = max(0.0, now - self.started)
        self.status = status
        for key, value in fields.items():
            setattr(self, key, value)


class Suite:
    """A target's testcases, what its run said, and the end of its log."""

    def __init__(self, target: str, playbook: str, gpus: tuple[int, ...], host: str, mask: Callable[[str], str], began: float) -> None:
        self.target, self.playbook, self.host, self.mask = target, playbook, host, mask
        self.began = began
        self.cases = {"preflight": Case("preflight", started=self.began)}
        for gpu in gpus:
            self.cases[f"warmup GPU {gpu}"] = Case(f"warmup GPU {gpu}")
        self.cases["training"] = Case("training")
        self.properties: dict[str, str] = {"target": target, "playbook": playbook}
        self.log = bytearray()
        self.abort_match: dict[str, Any] = {}

    def warmup(self, gpu: int) -> Case:
        name = f"warmup GPU {gpu}"
        if name not in self.cases:  # a GPU the plan did not list: keep training last
            training = self.cases.pop("training")
            self.cases[name] = Case(name)
            self.cases["training"] = training
        return self.cases[name]

    def current(self) -> Case:
        """The step in progress, else the next one to run: where an error or an interruption belongs."""
        cases = list(self.cases.values())
        return next((c for c in cases if c.status == "running"), None) or next(
            (c for c in cases if c.status == "pending"), cases[-1])

    def event(self, ev: Event) -> None:
        k, pre, train = ev.kind, self.cases["preflight"], self.cases["training"]
        if ev.run:
            self.properties["run"] = ev.run
        if k == "preflight_ok":
            pre.finish("passed", ev.ts)
            pre.out.extend(f"GPU {g['index']}: {g['memory_used_mib']} MiB used, {g['utilization_pct']}% busy"
                           for g in ev.get("gpus", []))
        elif k == "lock_recovered":
            pre.note(f"recovered the launch lock left by a launcher that died: {ev.get('holder')}")
        elif k == "warmup_start":
            case = self.warmup(ev.get("gpu"))
            case.status, case.started = "running", ev.ts
        elif k == "warmup_output":
            self.warmup(ev.get("gpu")).note(str(ev.get("line")))
        elif k == "warmup_draining":
            self.warmup(ev.get("gpu")).note(f"waiting for the GPU's memory to drain ({ev.get('memory_used_mib')} MiB)")
        elif k == "warmup_done":
            case = self.warmup(ev.get("gpu"))
            case.finish("passed", ev.ts)
            case.seconds = float(ev.get("seconds") or case.seconds)
        elif k in ("started", "following"):
            self._training_began(ev)
        elif k == "restart":
            self._restarted(ev)
        elif k == "waiting_start":
            train.note(f"attached while the launch of run {ev.run} was in its {ev.get('phase')} phase")
        elif k == "log":
            self.log += ev.get("bytes", b"")
            del self.log[:-LOG_TAIL_BYTES]
        elif k == "match":
            if ev.get("action") == "abort" and not self.abort_match:
                self.abort_match = dict(ev.data)
            self.current().note(f"{str(ev.get('action')).upper()}: rule '{ev.get('rule')}' matched at log line "
                                f"{ev.get('line_number')}: {ev.get('line')}")
        elif k not in ("run_created", "started", "following"):
            self.current().note(_note(ev))

    def _training_began(self, ev: Event) -> None:
        train = self.cases["training"]
        for case in self.cases.values():
            if case is not train and case.status in ("pending", "running"):  # logs -f: the launcher did these
                case.finish("passed", ev.ts, out=[f"done by the launcher of run {ev.run}"])
        if train.status == "pending":
            train.status, train.started = "running", ev.ts
        for key in ("session", "log"):
            if ev.get(key):
                self.properties[key] = str(ev.get(key))

    def _restarted(self, ev: Event) -> None:
        """The watchdog restarts training: the attempt that ended is a testcase of its own (a failure)."""
        n, most = int(ev.get("attempt") or 2), ev.get("max_attempts")
        prev = ev.get("previous") if isinstance(ev.get("previous"), dict) else {}
        ended = self.cases.pop("training")
        ended.name = f"training (attempt {n - 1})"
        if ended.started is None:
            ended.started = ev.ts
        ended.finish("failure", ev.ts, type=str(prev.get("outcome") or "aborted"), detail=self._detail(prev),
                     message=f"attempt {n - 1} ended by '{ev.get('after')}'; the watchdog restarted training "
                             f"(attempt {n} of {most}" + (", with the compile guard)" if ev.get("compile_guard") else ")"))
        self.cases[f"training-{n - 1}"] = ended
        self.cases["training"] = Case(f"training (attempt {n})", status="running", started=ev.ts)
        self.abort_match = {}

    def outcome(self, out: Outcome) -> None:
        now = time.time()
        self.properties.update({"outcome": out.outcome, "exit_code": str(out.exit_code)})
        if out.data.get("rule"):
            self.properties["rule"] = str(out.data["rule"])
        train = self.cases["training"]
        if out.outcome == "started":  # --detach: started, not finished, so neither passed nor failed
            train.finish("skipped", now, message=f"detached: {out.message}; the result is not known yet, and "
                         "the target's watchdog guards the run (follow it with `gpuops logs -f --junit PATH`)")
        elif out.outcome == "not-started":  # logs -f: the launch it waited for ended before training
            for case in self.cases.values():
                if case is not train and case.status == "pending":
                    case.finish("skipped", now, message="run by the launcher; its own report says how it went")
            train.finish("failure", now, type=out.outcome, message=out.message)
        elif out.exit_code == ExitCode.OK:
            for case in self.cases.values():
                if case.status in ("pending", "running"):
                    case.finish("passed", now)
        else:
            status = "failure" if out.exit_code in FAILED else "error"
            self.current().finish(status, now, type=out.outcome, message=out.message, detail=self._detail(out.data))
        self._skip_rest(now)

    def error(self, exc: BaseException, code: int) -> None:
        now = time.time()
        kind = ({ExitCode.INTERRUPTED: "interrupted", ExitCode.TERMINATED: "terminated", ExitCode.HANGUP: "hangup"}.get(code)
                or ERROR_TYPES.get(code, "error"))
        self.properties.update({"outcome": kind, "exit_code": str(code)})
        gpu = getattr(exc, "gpu", None)
        case = self.warmup(gpu) if gpu is not None and code == ExitCode.WARMUP else self.current()
        lines = [f"GPU {f.index}: " + ("ok" if f.ok else "BUSY: " + "; ".join(f.problems))
                 for f in getattr(exc, "findings", None) or []]
        lines += [f"    | {line}" for line in getattr(exc, "tail", None) or []]
        if getattr(exc, "hint", None):
            lines.append(f"hint: {exc.hint}")  # type: ignore[attr-defined]
        if isinstance(exc, GpuopsError):
            message = str(exc)
        elif isinstance(exc, KeyboardInterrupt):
            message = {ExitCode.TERMINATED: "terminated by SIGTERM", ExitCode.HANGUP: "hung up (SIGHUP)"}.get(
                code, "interrupted by Ctrl-C")
        else:
            message = f"{kind}: {type(exc).__name__}: {exc}".rstrip(": ")
        case.finish("failure" if code in FAILED else "error", now, type=kind, message=message, detail="\n".join(lines))
        self._skip_rest(now)

    def _detail(self, data: dict[str, Any]) -> str:
        rule = data.get("rule") or self.abort_match.get("rule")
        parts = [f"rule: {rule}"] if rule else []
        line = data.get("line") or self.abort_match.get("line")
        if line:
            parts.append(f"line: {line}")
        excerpt = data.get("excerpt") or self.abort_match.get("excerpt")
        if excerpt:
            parts.append("excerpt:\n" + str(excerpt))
        if data.get("last_line"):
            parts.append(f"last log line: {data['last_line']}")
        return "\n".join(parts)

    def _skip_rest(self, now: float) -> None:
        failed = next((c for c in self.cases.values() if c.status in ("failure", "error")), None)
        why = f"not run: {failed.name} ended with {failed.type}" if failed else "not run"
        for case in self.cases.values():
            if case.status == "pending":
                case.finish("skipped", now, message=why)
            elif case.status == "running":
                case.finish("error", now, type="unfinished", message="the command ended while this step ran")

    def log_tail(self) -> str:
        text = _ANSI.sub("", bytes(self.log).decode("utf-8", "replace")).replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        if len(self.log) >= LOG_TAIL_BYTES:
            lines = lines[1:]  # the first line was cut by the byte limit
        return self.mask("\n".join(lines[-LOG_TAIL_LINES:]).rstrip("\n"))


def _note(ev: Event) -> str:
    """One line about an event, for the system-out of the step it happened in."""
    d = ev.data
    if ev.kind == "stall":
        return f"STALL: no log output for {d.get('seconds')}s (stall_timeout {d.get('stall_timeout')}s)"
    if ev.kind == "abort_start":
        who = f" by the {d['by']}" if d.get("by") else ""
        return f"aborting run {ev.run}{who} ({d.get('reason')}" + (f": {d['rule']})" if d.get("rule") else ")")
    if ev.kind == "aborted":
        left = f"; SURVIVORS {d['survivors']}" if d.get("survivors") else ""
        return f"run {ev.run} stopped in {d.get('seconds')}s; its session is gone{left}"
    shown = {k: v for k, v in d.items() if k not in ("session_gone_at", "gpus", "bytes") and v not in (None, "", [])}
    return ev.kind + (": " + ", ".join(f"{k}={v}" for k, v in shown.items()) if shown else "")


class _Tee:
    """The renderer the command uses: everything goes to the real one, then to the report."""

    def __init__(self, inner: Render, report: Report) -> None:
        self._inner, self._report = inner, report

    def event(self, ev: Event) -> None:
        self._inner.event(ev)
        self._report.suite(ev.target).event(ev)

    def outcome(self, out: Outcome, target: str | None = None) -> None:
        self._inner.outcome(out, target)
        self._report.suite(target).outcome(out)
        self._report.ended = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Report:
    """A context manager around a command: records its events, outcome and errors; writes PATH at the end."""

    def __init__(self, path: str | None, command: str, target: str | None = None) -> None:
        self.path, self.command, self.default_target = path, command, target
        self.began = time.time()  # the command's start: preflight's time includes connecting and the lock
        self.suites: dict[str, Suite] = {}
        self.plays: dict[str, Play] = {}
        self.ended = False
        if path:
            check_writable(path, "--junit")

    def wrap(self, render: Render, play: Play) -> Render:
        """The renderer to use for `play`: the same output, also recorded (unchanged without --junit)."""
        if not self.path:
            return render
        self.plays[play.target.name] = play
        self.default_target = play.target.name
        return _Tee(render, self)

    def suite(self, target: str | None) -> Suite:
        name = target or self.default_target or "gpuops"
        if name not in self.suites:
            play = self.plays.get(name)
            if play is None:
                self.suites[name] = Suite(name, "gpuops", (), "", lambda text: text, self.began)
            else:
                warmup = play.playbook.warmup
                self.suites[name] = Suite(name, play.playbook.name, warmup.gpus if warmup else (), play.target.host,
                                          play.mask, self.began)
        return self.suites[name]

    def __enter__(self) -> Report:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not self.path:
            return
        if exc is not None and not self.ended:
            code = (exc.exit_code if isinstance(exc, GpuopsError)
                    else getattr(exc, "exit_code", ExitCode.INTERRUPTED)  # SIGTERM's Terminated says 143, SIGHUP's 129
                    if isinstance(exc, KeyboardInterrupt) else ExitCode.BROKEN_PIPE
                    if isinstance(exc, BrokenPipeError) else ExitCode.INTERNAL)
            self.suite(getattr(exc, "target", None)).error(exc, code)
        elif not self.suites:
            self.suite(None)._skip_rest(time.time())
        for suite in self.suites.values():
            suite._skip_rest(time.time())
        try:
            write(self.path, self.command, list(self.suites.values()))
        except OSError as err:
            import sys

            sys.stderr.write(f"gpuops: error: could not write the JUnit report {self.path}: {err.strerror or err}\n")


def clean(text: str) -> str:
    """Text XML 1.0 can hold: characters it refuses are shown as \\xNN."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def write(path: str, command: str, suites: list[Suite]) -> None:
    """The report as testsuites/testsuite/testcase, written whole (a reader never sees half a file)."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name=f"gpuops {command}")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    elapsed = 0.0
    for suite in suites:
        node, counts, seconds = _suite(suite, command)
        root.append(node)
        elapsed += seconds
        for key in totals:
            totals[key] += counts[key]
    # junit-10.xsd (Jenkins', pytest's) gives <testsuites> no `skipped`: the suites carry it.
    root.attrib.update({k: str(v) for k, v in totals.items() if k != "skipped"})
    root.set("time", f"{elapsed:.3f}")
    ET.indent(root)
    from gpuops.localfiles import write_whole

    out = io.BytesIO()
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    write_whole(path, out.getvalue())


def _suite(suite: Suite, command: str) -> tuple[Any, dict[str, int], float]:
    import xml.etree.ElementTree as ET

    seconds = max(0.0, time.time() - suite.began)
    cases = list(suite.cases.values())
    counts = {"tests": len(cases), "failures": sum(c.status == "failure" for c in cases),
              "errors": sum(c.status == "error" for c in cases), "skipped": sum(c.status == "skipped" for c in cases)}
    node = ET.Element("testsuite", name=clean(suite.target), attrib={k: str(v) for k, v in counts.items()},
                      time=f"{seconds:.3f}", timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(suite.began)),
                      hostname=clean(suite.host or suite.target))
    props = ET.SubElement(node, "properties")
    for key, value in {"command": f"gpuops {command}", **suite.properties}.items():
        ET.SubElement(props, "property", name=key, value=clean(value))
    for case in cases:
        item = ET.SubElement(node, "testcase", name=case.name, classname=clean(f"{suite.playbook}.{suite.target}"),
                             time=f"{case.seconds:.3f}")
        if case.status in ("failure", "error"):
            verdict = ET.SubElement(item, case.status, type=case.type, message=clean(case.message))
            verdict.text = clean(case.detail) or None
        elif case.status == "skipped":
            ET.SubElement(item, "skipped", message=clean(case.message))
        out = "\n".join(case.out)
        if case is suite.cases.get("training") and suite.log:  # the last attempt's testcase
            out = (out + "\n" if out else "") + "--- the end of the training log ---\n" + suite.log_tail()
        if out:
            ET.SubElement(item, "system-out").text = clean(out)
    return node, counts, seconds


NO_REPORT = Report(None, "")
