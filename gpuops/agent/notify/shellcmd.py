"""The `command` channel kind: a command bash runs on the target (sh/notify.sh: in the run's workdir, with the
playbook's env), the payload's file in $GPUOPS_NOTIFY_JSON and its line in $GPUOPS_NOTIFY_TEXT, within its
kind's limit (then its whole process group is killed); the last bytes of its output, over all its tries, are
kept in the try's output file. Its entry is in gpuops/agent/wire/channel_list.py.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
from typing import Any, Dict, Set

from .. import SH
from . import deliver
from .deliver import OUTPUT_LIMIT

#: How long the output of a command that ended is read on: a child it left behind may hold its pipe.
OUTPUT_DRAIN = 2.0

#: Process groups of the notify commands running now (notify-test ends them when its client is gone).
RUNNING: Set[int] = set()
_running_lock = threading.Lock()


class Sender(deliver.Sender):
    """One try: the command, its exit status the answer (0: taken; else tried again)."""

    def send(self, payload: Dict[str, Any], attempt: deliver.Try) -> deliver.Answer:
        command = self.settings.command
        if not command:
            return {"ok": False, "reason": "the channel has no command", "retry": False}
        return run_command(str(command), attempt.folder, attempt.payload_file, str(payload["text"]), attempt.output,
                           timeout=attempt.limit)

    @classmethod
    def end_all(cls) -> None:
        kill_running()


def run_command(command: str, folder: str, payload_file: str, text: str, output: str,
                timeout: float) -> Dict[str, Any]:
    """The command, in the run's workdir and env (sh/notify.sh), the tail of its output kept in `output`:
    {ok, exit, reason}."""
    # An environment value cannot hold NUL (exec refuses it): a NUL of the matched line is shown as \x00.
    env = dict(os.environ, GPUOPS_NOTIFY_JSON=payload_file, GPUOPS_NOTIFY_TEXT=text.replace("\x00", "\\x00"))
    rfd, wfd = os.pipe()
    try:
        proc = subprocess.Popen(["bash", os.path.join(SH, "notify.sh"), folder, command], stdin=subprocess.DEVNULL,
                                stdout=wfd, stderr=wfd, env=env, start_new_session=True, close_fds=True)
    except (OSError, ValueError) as exc:
        os.close(rfd)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return {"ok": False, "reason": "cannot run the command: %s" % why, "retry": False}
    finally:
        os.close(wfd)
    with _running_lock:
        RUNNING.add(proc.pid)
    kept = _Tail(rfd)
    try:
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            code = None
    finally:
        with _running_lock:
            RUNNING.discard(proc.pid)
        kept.finish(output)
    if code is None:
        return {"ok": False, "reason": "the command did not end within %gs (killed)" % timeout, "retry": True}
    if code == 0:
        return {"ok": True, "exit": 0}
    return {"ok": False, "exit": code, "reason": "the command exited with code %d (its output: %s)" % (code, output),
            "retry": True}


class _Tail:
    """Reads a command's output as it comes and keeps its last OUTPUT_LIMIT bytes."""

    def __init__(self, fd: int) -> None:
        self.fd, self.data, self.stop = fd, bytearray(), threading.Event()
        self.thread = threading.Thread(target=self._read, name="gpuops-notify-output", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if not ready:
                    if self.stop.is_set():
                        return
                    continue
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    return
                self.data += chunk
                if len(self.data) > 2 * OUTPUT_LIMIT:
                    del self.data[:-OUTPUT_LIMIT]
        finally:
            os.close(self.fd)

    def finish(self, output: str) -> None:
        """The command ended: read what is left (for a moment), then keep the tail with the tries' before."""
        self.thread.join(OUTPUT_DRAIN)
        self.stop.set()
        self.thread.join()
        try:
            with open(output, "rb") as fh:
                before = fh.read()[-OUTPUT_LIMIT:]
        except OSError:
            before = b""
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (before + bytes(self.data))[-OUTPUT_LIMIT:])
        finally:
            os.close(fd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass



def kill_running() -> None:
    """End every notify command running now (its whole process group)."""
    with _running_lock:
        pids = list(RUNNING)
    for pid in pids:
        _kill_group(pid)
