"""One round trip that reads everything status and preflight need from a target."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpuops.client.gpus import Gpu, SmiError, parse_gpus
from gpuops.client.runs import RunInfo
from gpuops.agent.protocol import MARK

# The probe itself is the shipped shell tool gpuops/agent/sh/probe.sh (gpuops.client.tools.probe).


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
    python: tuple[int, ...] | None = None  # the target's python3 version; None when it has none
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
        elif key == "python":
            probe.python = _version(value)
        elif key == "samples":
            section = "samples"
            buf.setdefault("samples", [])
        elif key == "samples_end":
            section = None
            if current is not None and current.run is not None:
                current.run.samples_text = "\n".join(buf.pop("samples", []))
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
    elif key == "abort_done":
        state.run.abort_done = _json(value)
    elif key == "watchdog":
        state.run.watchdog = _json(value)
    elif key == "watchdog_pid":
        state.run.watchdog_running = value.strip() == "alive"
    elif key == "log":
        size, _, mtime = value.partition(" ")
        state.run.log_size, state.run.log_mtime = int(size), float(mtime)


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _version(text: str) -> tuple[int, ...] | None:
    parts = text.strip().split(".")
    return tuple(int(x) for x in parts) if parts and all(x.isdigit() for x in parts) else None
