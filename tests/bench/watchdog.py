"""The watchdog of a bench run, seen from outside: its processes, its heartbeat, its events; and
how a test takes it away (the watchdog alone, the supervisor restarts it; or both, for good)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from bench import procs
from bench.waiting import wait_until


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return []


def pids(run_id: str, tool: str = "watchdog") -> list[int]:
    """Live processes running `python3 -m gpuops_agent TOOL RUN_ID` (watchdog or supervise)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            argv = _cmdline(int(entry))
            if "gpuops_agent" in argv and tool in argv and run_id in argv:
                found.append(int(entry))
    return found


def heartbeat(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "watchdog.json").read_text())
    except (OSError, ValueError):
        return {}


def events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        text = (run_dir / "events.jsonl").read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_watching(run_dir: Path, timeout: float = 60.0) -> int:
    """The watchdog's pid once its heartbeat says it watches."""
    def ready() -> int | None:
        beat = heartbeat(run_dir)
        pid = beat.get("pid")
        return pid if beat.get("state") == "watching" and isinstance(pid, int) and procs.is_alive(pid) else None

    return wait_until(ready, timeout=timeout, message="the run's watchdog to watch")


def kill_watchdog(run_dir: Path) -> int:
    """SIGKILL the watchdog (its supervisor starts a new one); returns the pid killed."""
    pid = wait_watching(run_dir)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not procs.is_alive(pid), timeout=30, message=f"watchdog {pid} to die")
    return pid


def remove_watchdog(run_dir: Path) -> None:
    """Take the watchdog away for good: its supervisor and the watchdog, both SIGKILLed."""
    run_id = run_dir.name
    wait_watching(run_dir)
    for tool in ("supervise", "watchdog"):
        for pid in pids(run_id, tool):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    wait_until(lambda: not pids(run_id, "supervise") and not pids(run_id, "watchdog"), timeout=30,
               message="the watchdog and its supervisor to be gone")
