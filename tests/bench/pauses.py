"""Holding the agent at a named point (gpuops/agent/system/pause.py): how a test forces a race window open."""

from __future__ import annotations

from pathlib import Path


def pause_env(fake, folder: Path, *points: str, vmid: int = 200) -> Path:
    """Every later `pct exec` of the container stops at `points` (`name` waits for release, `name=S` sleeps S s)."""
    folder.mkdir(parents=True, exist_ok=True)
    fake.set_env(vmid, GPUOPS_TEST_PAUSE_AT=",".join(points), GPUOPS_TEST_PAUSE_DIR=str(folder))
    return folder


def reached(folder: Path, name: str) -> list[int]:
    """The pids that arrived at `name` so far (one line per arrival)."""
    try:
        return [int(x) for x in (folder / f"{name}.reached").read_text().split()]
    except OSError:
        return []


def release(folder: Path, name: str) -> None:
    """Let every process at `name` (and every later one) go on."""
    (folder / f"{name}.go").touch()


def flock_waiters() -> set[int]:
    """Pids blocked in flock(2) right now (/proc/locks lists them with `->`)."""
    out = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[2] == "FLOCK":
            out.add(int(fields[5]))
    return out
