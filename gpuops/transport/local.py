"""Commands on this machine: argv executed directly, no shell but the `bash -c` we ask for."""

from __future__ import annotations

import os
import select
import shlex
import signal
import subprocess

from gpuops.command import Cmd
from gpuops.errors import CommandTimeout
from gpuops.transport.base import HostSide, Result


class ProcStream:
    """A process with merged output on pipes: read with a timeout, write, wait. The local stream is one;
    OpenSSH's (ssh/openssh.py) is one too, with its own way to tell a lost connection and to end."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._eof = False

    def read(self, timeout: float) -> bytes | None:
        if self._eof:
            return b""
        ready, _, _ = select.select([self._fd], [], [], max(timeout, 0))
        if not ready:
            return None
        data = os.read(self._fd, 65536)
        if not data:
            self._eof = True
        return data

    def write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def close_stdin(self) -> None:
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass

    def wait(self, timeout: float) -> int | None:
        try:
            return self._proc.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            return None

    def connection_lost(self) -> bool:
        return False  # a local process has no connection to lose


class LocalStream(ProcStream):
    """A local process with merged output, in its own session so Ctrl-C here does not reach it."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    def close(self) -> None:
        self.close_stdin()
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGHUP)
            except ProcessLookupError:
                pass
        if self._proc.stdout:
            self._proc.stdout.close()
        self._proc.wait()


class LocalTransport(HostSide):
    """This machine; the environment of gpuops itself is inherited (PATH included)."""

    def __init__(self, label: str = "local", *, command_timeout: float = 60.0) -> None:
        self.label = label
        self.command_timeout = command_timeout
        self.connections_made = 0
        self.commands = 0

    def wrap(self, cmd: Cmd) -> Cmd:
        return cmd

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return cmd.render(display=display)

    def run(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> Result:
        self.commands += 1
        argv = cmd.words()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CommandTimeout(f"{self.label}: `{shlex.join(argv[:2])} ...` ran past {timeout:g}s") from None
        return Result(proc.returncode, out, err)

    def open(self, cmd: Cmd) -> LocalStream:
        self.commands += 1
        return LocalStream(cmd.words())

    def connect_soon(self) -> None:
        return None

    def connect(self) -> None:
        return None

    def reconnect(self) -> None:
        return None

    def close(self) -> None:
        return None

