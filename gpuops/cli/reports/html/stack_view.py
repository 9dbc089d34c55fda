"""The report's Stacks section: every attempt's stacks (a restarted run keeps attempt n's in attempts/<n>/stacks/),
per process its threads and, per thread, its innermost frame and the innermost frame of the training's own code.

Collapsible (HTML <details>, no script): an attempt's list of processes is open, each process is one closed line
that already names its threads' place in the training's code. Every text passes through html.escape here.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from html import escape
from typing import Any

from gpuops.agent.wire.stackfile import parse

#: `# gpuops stacks of pid 806 via faulthandler at 2026-12-03T16:01:46Z: /usr/bin/python3 train.py` (agent/run/stacks.py)
_HEADER = re.compile(r"^# gpuops stacks of pid \d+ via (\S+)(?: at (\S+?))?(?:: (.*))?$", re.M)
#: Frames of Python's own library, of installed packages and of gpuops' agent: not the training's code.
_LIBRARY = re.compile(r"(^|/)(site|dist)-packages/|/lib/python\d[\d.]*/|/gpuops_agent/|^<")
SHOWN_COMMAND = 110  # characters of a process's command in its one line


def own_code(frame: dict[str, Any]) -> bool:
    """The frame is in the training's own code: a Python line outside the standard library and installed packages."""
    file = str(frame.get("file") or "")
    if frame.get("line") is None or not file or _LIBRARY.search(file):
        return False  # a native frame (py-spy --native), or a library's
    top = file.split("/")[0].removesuffix(".py")
    return file.startswith("/") or top not in sys.stdlib_module_names  # py-spy names stdlib files short


def where(frame: dict[str, Any] | None, short: bool = True) -> str:
    """A frame as `function (file:line)`, the file shortened past site-packages or to its name."""
    if frame is None:
        return "-"
    file = str(frame.get("file") or "?")
    if short:
        cut = re.search(r"(?:site|dist)-packages/(.*)$", file) or re.search(r"/lib/python\d[\d.]*/(.*)$", file)
        file = cut.group(1) if cut else file.rsplit("/", 1)[-1]
    line = frame.get("line")
    return f"{frame.get('function')} ({file}{':' + str(line) if line is not None else ''})"


@dataclass
class Process:
    pid: str
    file: str
    text: str = ""
    via: str = ""
    at: str = ""
    command: str = ""
    threads: list[dict[str, Any]] = field(default_factory=list)
    cut: bool = False
    error: str = ""  # the process did not answer, or its file is not in the report


@dataclass
class Attempt:
    number: int | None  # None: a run that never restarted
    heading: str
    processes: list[Process]


def _process(st: dict[str, Any], about: dict[str, dict[str, Any]]) -> Process:
    text = str(st.get("text") or "")
    head = _HEADER.search(text)
    info = about.get(str(st.get("pid")), {})
    proc = Process(str(st.get("pid")), str(st.get("file") or ""), text, str(st.get("via") or info.get("via") or ""),
                   cut=bool(st.get("cut")), threads=parse(text))
    if head is not None:
        proc.via = proc.via or head.group(1)
        proc.at, proc.command = head.group(2) or "", (head.group(3) or "").strip()
    if st.get("error") or info.get("error"):
        proc.error = str(st.get("error") or info.get("error"))
    elif st.get("left_out"):
        proc.error = "left out of this report (its stacks are past the report's size); `gpuops logs --stacks` prints it"
    return proc


def attempts(rec: dict[str, Any], said_stacks: Any) -> list[Attempt]:
    """The run's stacks grouped by attempt, oldest first, each with what ended it."""
    current = (rec.get("attempt") or {}).get("attempt")
    current = current if isinstance(current, int) else 1
    ended = {a.get("attempt"): a for a in rec.get("attempts") or [] if isinstance(a, dict)}
    listed: dict[int, list[Any]] = {n: a.get("stacks_taken") or [] for n, a in ended.items() if isinstance(n, int)}
    listed[current] = said_stacks or (rec.get("abort_done") or {}).get("stacks") or []
    groups: dict[int, list[dict[str, Any]]] = {}
    for st in rec.get("stacks") or []:
        if isinstance(st, dict):
            n = st.get("attempt")
            groups.setdefault(n if isinstance(n, int) else current, []).append(st)
    out = []
    for n in sorted(groups):
        about = {str(x.get("pid")): x for x in listed.get(n) or [] if isinstance(x, dict)}
        procs = sorted((_process(st, about) for st in groups[n]), key=lambda p: not any(  # the training's first
            own_code(f) for t in p.threads for f in t.get("frames") or []))
        threads = sum(len(p.threads) for p in procs)
        what = f"{len(procs)} process{'es' if len(procs) != 1 else ''}, {threads} thread{'s' if threads != 1 else ''}"
        taken = "taken before its abort" if about else "as last taken"
        if n in ended:
            a = ended[n]
            how = ", ".join(str(x) for x in (a.get("outcome"), f"exit {a['exit_code']}" if a.get("exit_code") is not None
                                              else None) if x)
            heading = f"Attempt {n}" + (f" ({how})" if how else "") + f": {what}, {taken}"
        else:
            heading = (f"Attempt {n}: " if len(groups) > 1 or current > 1 else "") + f"{what}, {taken}"
        out.append(Attempt(n if current > 1 else None, heading, procs))
    return out


def _thread_rows(proc: Process) -> str:
    rows = ['<table class="threads"><tr><th>thread</th><th>innermost frame</th><th>innermost in the training\'s code</th></tr>']
    for t in proc.threads:
        frames = t.get("frames") or []
        mine = next((f for f in frames if own_code(f)), None)
        label = str(t.get("id")) + (f" {t['name']}" if t.get("name") else "") + (f" ({t['state']})" if t.get("state") else "")
        rows.append(f"<tr><td>{escape(label)}</td><td>{escape(where(frames[0] if frames else None))}</td>"
                    f"<td>{escape(where(mine, short=False) if mine else 'none: library code only')}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _line(proc: Process) -> str:
    """A process's one line: pid, threads, how taken, its command, and where its threads are in the training's code."""
    said = f"process {proc.pid}: "
    if proc.error:
        return said + proc.error
    mine = [where(f) for t in proc.threads for f in (next((f for f in t.get("frames") or [] if own_code(f)), None),)
            if f is not None]
    counted = ", ".join(f"{w}{f' x{mine.count(w)}' if mine.count(w) > 1 else ''}" for w in dict.fromkeys(mine))
    command = short_command(proc.command)
    said += f"{len(proc.threads)} thread{'s' if len(proc.threads) != 1 else ''}" + (f" via {proc.via}" if proc.via else "")
    said += f", {command}" if command else ""
    return said + (f"; in the training's code: {counted}" if counted else "; no thread in the training's code")


def short_command(command: str) -> str:
    """A process's command for its one line: the interpreter by name, package files from their package on, cut."""
    words = command.split(" ")
    words = [words[0].rsplit("/", 1)[-1]] + [re.sub(r"^.*/(?:site|dist)-packages/", "", w) for w in words[1:]]
    said = " ".join(words)
    return said if len(said) <= SHOWN_COMMAND else said[:SHOWN_COMMAND] + "..."


def section(groups: list[Attempt]) -> str:
    """The Stacks section's HTML (empty when the run has none)."""
    if not groups:
        return ""
    parts = ['<h3 id="stacks">Stacks</h3><p class="note">Each Python process of the training, its threads innermost '
             "frame first. The training's code: frames outside Python's own library and installed packages. "
             "Open a process for its threads, and its file for the stacks as taken.</p>"]
    for g in groups:
        anchor = f' id="stacks-attempt-{g.number}"' if g.number is not None else ""
        parts.append(f'<details class="attempt" open{anchor}><summary>{escape(g.heading)}</summary>')
        for proc in g.processes:
            parts.append(f'<details class="stack"><summary>{escape(_line(proc))}</summary>')
            if proc.threads:
                parts.append(_thread_rows(proc))
            where_from = proc.file + (" (cut: the file is longer)" if proc.cut else "") + (f", taken {proc.at}" if proc.at else "")
            if proc.text:
                parts.append(f'<details class="file"><summary>{escape(where_from)}</summary><pre>{escape(proc.text)}</pre></details>')
            parts.append("</details>")
        parts.append("</details>")
    return "\n".join(parts)
