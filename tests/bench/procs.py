"""Find and kill the bench's processes by what their environment says, the way a container stop would."""

from __future__ import annotations

import os
import signal
from typing import Callable, Iterable

from bench.waiting import wait_until


def environ(pid: int) -> dict[bytes, bytes] | None:
    """The initial environment of a process, or None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    env: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key] = value
    return env


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
    return state not in (b"Z", b"X")


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def _protected() -> set[int]:
    """This process and its ancestors: never killed by a sweep."""
    pids = set()
    pid: int | None = os.getpid()
    while pid and pid not in pids:
        pids.add(pid)
        pid = parent_pid(pid)
    return pids


def find(match: Callable[[dict[bytes, bytes]], bool]) -> list[int]:
    """Live pids whose environment satisfies `match` (this process and its ancestors excluded)."""
    keep = _protected()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in keep:
            continue
        env = environ(pid)
        if env is not None and match(env) and is_alive(pid):
            found.append(pid)
    return sorted(found)


def mentioning(text: str) -> Callable[[dict[bytes, bytes]], bool]:
    """A matcher for processes with `text` anywhere in an environment value (e.g. a bench root path)."""
    needle = text.encode()
    return lambda env: any(needle in value for value in env.values())


def kill_all(pids: Iterable[int], *, timeout: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL what is left after `timeout`; return the pids that were signalled."""
    pids = [p for p in pids if is_alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            wait_until(lambda: not any(is_alive(p) for p in pids), timeout=timeout, message="processes to exit")
            break
        except AssertionError:
            continue
    return pids


def sweep(match: Callable[[dict[bytes, bytes]], bool], *, rounds: int = 3) -> list[int]:
    """Kill every matching process, repeating while new ones appear (a dying parent may fork a last child)."""
    killed: list[int] = []
    for _ in range(rounds):
        pids = find(match)
        if not pids:
            break
        killed += kill_all(pids)
    return killed
