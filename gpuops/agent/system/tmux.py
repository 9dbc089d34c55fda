"""tmux on the target, from Python: `=name` targets match the session name exactly (no prefixes)."""

from __future__ import annotations

import os
import subprocess
from typing import List, Optional

from .procs import marked

#: What tmux says when its server answered and has no such session: the session is gone.
_NO_SESSION = "can't find session"
#: What tmux says when it reached no server: the server exited (gone), or its socket was deleted
#: while it runs on (alive): only the run's processes can tell.
_NO_SERVER = ("no server running", "error connecting to")

ALIVE, GONE, UNSURE = "alive", "gone", "unsure"


def _tmux(*args: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout)


def _ask(session: str) -> "tuple[str, str]":
    """(ALIVE | GONE | UNSURE, what tmux said): a tmux that failed (a version mismatch, fork EAGAIN,
    a timeout, no server reachable) says nothing for sure about the session."""
    try:
        result = _tmux("has-session", "-t", "=" + session)
    except (OSError, subprocess.SubprocessError) as exc:
        return UNSURE, str(exc)
    if result.returncode == 0:
        return ALIVE, ""
    said = result.stderr.decode("utf-8", "replace").lower()
    return (GONE if _NO_SESSION in said else UNSURE), said


def state(session: str) -> str:
    """ALIVE, GONE (tmux's server said so) or UNSURE."""
    return _ask(session)[0]


def alive(session: str) -> bool:
    """The session exists (tmux answered so); False also when tmux failed."""
    return state(session) == ALIVE


def gone(session: str, run_id: str) -> bool:
    """The session is confirmed gone: tmux's server says so, or no tmux server is there at all (its
    socket is listened on by nobody; where that cannot be read, no process of the run is left). A
    tmux error alone (a version mismatch, fork EAGAIN, a timeout, a deleted socket) never ends a run."""
    said, words = _ask(session)
    if said != UNSURE:
        return said == GONE
    listening = server_listening()
    if listening is not None:
        return not listening
    return any(w in words for w in _NO_SERVER) and not marked(run_id)


def socket_path() -> str:
    """The default server's socket, as tmux makes it: $TMUX_TMPDIR (else /tmp), resolved, /tmux-UID/default."""
    folder = os.environ.get("TMUX_TMPDIR") or "/tmp"
    return os.path.join(os.path.realpath(folder), "tmux-%d" % os.getuid(), "default")


def server_listening() -> Optional[bool]:
    """Whether a tmux server is bound to the default socket (also one whose socket file was deleted: the
    kernel still lists the name it was bound to); None where /proc/net/unix cannot be read."""
    want = socket_path()
    try:
        with open("/proc/net/unix", "rb") as fh:
            lines = fh.read().decode("utf-8", "replace").splitlines()[1:]
    except OSError:
        return None
    return any(line.split()[-1:] == [want] for line in lines if len(line.split()) >= 8)


def new_detached(session: str, start_dir: str, argv: List[str], window: str = "") -> subprocess.CompletedProcess:
    """Start argv (run by tmux's shell, each word quoted) in a new detached session, its window named
    `window` (tmux's automatic renaming after the running command is then off for it)."""
    import shlex

    named = ["-n", window] if window else []
    return _tmux("new-session", "-d", "-s", session, *named, "-c", start_dir, "-x", "200", "-y", "50",
                 " ".join(shlex.quote(a) for a in argv))


def _try(*args: str) -> Optional[subprocess.CompletedProcess]:
    """A tmux command whose failure the caller copes with (None when tmux could not run)."""
    try:
        return _tmux(*args)
    except (OSError, subprocess.SubprocessError):
        return None


def interrupt(session: str) -> None:
    """Ctrl-C to the pane: the terminal sends SIGINT to the foreground job."""
    _try("send-keys", "-t", "=" + session + ":", "C-c")


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
    result = _try("display-message", "-p", "-t", "=" + session + ":", "#{pane_pid}")
    if result is None:
        return None
    text = result.stdout.decode().strip()
    return int(text) if result.returncode == 0 and text.isdigit() else None


def kill(session: str) -> None:
    _try("kill-session", "-t", "=" + session)
