"""tmux on the target, from Python: `=name` targets match the session name exactly (no prefixes)."""

from __future__ import annotations

import os
import subprocess
from typing import List, Optional


def _tmux(*args: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout)


def alive(session: str) -> bool:
    try:
        return _tmux("has-session", "-t", "=" + session).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def new_detached(session: str, start_dir: str, argv: List[str]) -> subprocess.CompletedProcess:
    """Start argv (run by tmux's shell, each word quoted) in a new detached session."""
    import shlex

    return _tmux("new-session", "-d", "-s", session, "-c", start_dir, "-x", "200", "-y", "50",
                 " ".join(shlex.quote(a) for a in argv))


def interrupt(session: str) -> None:
    """Ctrl-C to the pane: the terminal sends SIGINT to the foreground job."""
    _tmux("send-keys", "-t", "=" + session + ":", "C-c")


def signal_foreground(session: str, signum: int) -> None:
    """Send a signal to the process group in the foreground of the session's pane."""
    pid = pane_pid(session)
    if pid is None:
        return
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        tpgid = int(fields[5])  # the terminal's foreground process group
        os.killpg(tpgid if tpgid > 0 else pid, signum)
    except (OSError, ValueError, IndexError):
        pass


def pane_pid(session: str) -> Optional[int]:
    result = _tmux("display-message", "-p", "-t", "=" + session + ":", "#{pane_pid}")
    text = result.stdout.decode().strip()
    return int(text) if result.returncode == 0 and text.isdigit() else None


def kill(session: str) -> None:
    _tmux("kill-session", "-t", "=" + session)
