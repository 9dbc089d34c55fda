"""One round trip that reads everything status and preflight need from a target."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from gpuops.command import Script
from gpuops.gpus import QUERY_APPS, QUERY_GPUS, Gpu, SmiError, parse_gpus
from gpuops.runs import RunInfo

MARK = "@@gpuops "


def probe_script(sessions: tuple[str, ...] | None) -> Script:
    """Bash that prints marked sections: clock, GPUs, and each session's run and lock."""
    if sessions is None:
        session_list = 'for f in "$G"/sessions/*; do [ -f "$f" ] && printf "%s\\n" "${f##*/}"; done'
    else:
        session_list = "printf '%s\\n' " + " ".join(shlex.quote(s) for s in sessions)
    return Script(
        'G="$HOME/.gpuops"',
        f'echo "{MARK}now $(date +%s)"',
        # The two nvidia-smi queries run side by side: each call initialises the driver (tens of ms).
        "if command -v nvidia-smi >/dev/null 2>&1; then",
        '  A="${TMPDIR:-/tmp}/gpuops-probe.$$"',
        f'  {{ {QUERY_APPS.render()} >"$A" 2>&1; echo "$?" >"$A.rc"; }} &',
        f'  echo "{MARK}gpus"; {QUERY_GPUS.render()} 2>&1; echo "{MARK}gpus_rc $?"',
        f'  wait; echo "{MARK}apps"; cat "$A" 2>/dev/null; echo "{MARK}apps_rc $(cat "$A.rc" 2>/dev/null || echo 1)"; rm -f "$A" "$A.rc"',
        f'else echo "{MARK}nosmi"; fi',
        f"command -v tmux >/dev/null 2>&1 || echo \"{MARK}notmux\"",
        f"{session_list} | while IFS= read -r S; do",
        f'  echo "{MARK}session $S"',
        '  if tmux has-session -t "=$S" 2>/dev/null; then echo "' + MARK + 'alive"; fi',
        '  if [ -f "$G/locks/$S.lock" ] && ! flock -n "$G/locks/$S.lock" true 2>/dev/null; then',
        f'    echo "{MARK}locked $(cat "$G/locks/$S.holder" 2>/dev/null | head -c 300)"; fi',
        '  R=$(cat "$G/sessions/$S" 2>/dev/null)',
        '  case "$R" in ""|*[!0-9a-z-]*) continue;; esac',
        '  D="$G/runs/$R"; [ -d "$D" ] || continue',
        f'  echo "{MARK}run $R"',
        f'  [ -f "$D/meta.json" ] && echo "{MARK}meta $(head -c 65536 "$D/meta.json")"',
        f'  [ -f "$D/exit_code" ] && echo "{MARK}exit $(head -c 16 "$D/exit_code")"',
        f'  [ -f "$D/abort.json" ] && echo "{MARK}abort $(head -c 65536 "$D/abort.json")"',
        f'  [ -f "$D/log" ] && echo "{MARK}log $(stat -c \'%s %Y\' "$D/log")"',
        "done",
        "true",
    )


@dataclass
class SessionState:
    session: str
    alive: bool = False
    locked_by: str | None = None
    run: RunInfo | None = None


@dataclass
class Probe:
    now: float | None = None
    smi: str = "ok"  # ok | absent | error
    smi_error: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    tmux: bool = True
    sessions: dict[str, SessionState] = field(default_factory=dict)


def parse_probe(text: str) -> Probe:
    """Read the marked sections back into values."""
    probe = Probe()
    section: str | None = None
    buf: dict[str, list[str]] = {"gpus": [], "apps": []}
    rcs: dict[str, int] = {}
    current: SessionState | None = None
    for line in text.splitlines():
        if not line.startswith(MARK):
            if section in buf:
                buf[section].append(line)
            continue
        key, _, value = line[len(MARK):].partition(" ")
        if key == "now":
            probe.now = float(value) if value else None
        elif key in ("gpus", "apps"):
            section = key
        elif key in ("gpus_rc", "apps_rc"):
            rcs[key] = int(value or 1)
            section = None
        elif key == "nosmi":
            probe.smi = "absent"
        elif key == "notmux":
            probe.tmux = False
        elif key == "session":
            section = None
            current = probe.sessions.setdefault(value, SessionState(value))
        elif current is not None:
            _session_field(current, key, value, probe.now)
    if probe.smi == "ok":
        if rcs.get("gpus_rc", 1) != 0 or rcs.get("apps_rc", 1) != 0:
            probe.smi = "error"
            failed = buf["gpus"] if rcs.get("gpus_rc", 1) != 0 else buf["apps"]  # a missing driver fails both alike
            probe.smi_error = " ".join(" ".join(failed).split())[:300] or "nvidia-smi failed"
        else:
            try:
                probe.gpus = parse_gpus("\n".join(buf["gpus"]), "\n".join(buf["apps"]))
            except SmiError as exc:
                probe.smi, probe.smi_error = "error", str(exc)
    for state in probe.sessions.values():
        if state.run is not None:
            state.run.session_alive = state.alive
            state.run.meta["launcher_alive"] = state.locked_by is not None
    return probe


def _session_field(state: SessionState, key: str, value: str, now: float | None) -> None:
    if key == "alive":
        state.alive = True
    elif key == "locked":
        state.locked_by = value or "another gpuops launch"
    elif key == "run":
        state.run = RunInfo(run_id=value, session=state.session, remote_now=now)
    elif state.run is None:
        return
    elif key == "meta":
        state.run.meta = _json(value)
    elif key == "exit":
        state.run.exit_code = int(value) if value.strip().lstrip("-").isdigit() else None
    elif key == "abort":
        state.run.abort = _json(value)
    elif key == "log":
        size, _, mtime = value.partition(" ")
        state.run.log_size, state.run.log_mtime = int(size), float(mtime)


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
