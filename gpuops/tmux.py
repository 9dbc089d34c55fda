"""tmux session commands as shell fragments; `=name` targets match the name exactly."""

from __future__ import annotations

import shlex


def exact(session: str) -> str:
    """A tmux target that matches only this session (no prefix matching)."""
    return shlex.quote(f"={session}")


def pane(session: str) -> str:
    """The session's active pane as a tmux target."""
    return shlex.quote(f"={session}:")


def alive(session: str) -> str:
    """Succeeds when the session exists."""
    return f"tmux has-session -t {exact(session)} 2>/dev/null"


def new_detached(session: str, start_dir: str, command: str) -> str:
    """Start `command` (trusted shell, run by tmux's shell) in a new detached session."""
    return f"tmux new-session -d -s {shlex.quote(session)} -c {start_dir} -x 200 -y 50 {shlex.quote(command)}"


def interrupt(session: str) -> str:
    """Ctrl-C to the pane: the terminal sends SIGINT to the foreground job."""
    return f"tmux send-keys -t {pane(session)} C-c"


def pane_pid(session: str) -> str:
    """Prints the pid of the process running in the session's pane."""
    return f"tmux display-message -p -t {pane(session)} '#{{pane_pid}}' 2>/dev/null"


def kill(session: str) -> str:
    return f"tmux kill-session -t {exact(session)} 2>/dev/null"
