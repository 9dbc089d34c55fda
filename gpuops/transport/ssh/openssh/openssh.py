"""An SSH host through the user's own `ssh` (as Ansible connects): their config, agents, certificates, FIDO keys
and ProxyCommands, every command over one ControlMaster (the user's where they have one open, else gpuops' own
with ControlPersist, so the next gpuops command to the host makes no new login; where no private folder can hold
its socket, none: a first login checks the host, then each command logs in on its own). ssh's own words go to a log
file of their own (-E), so the remote command's stderr and exit status stay the command's: an exit status of
255 is ssh's failure only when ssh said so or the master is gone (a remote `exit 255` is the command's)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import tempfile
from typing import Any, Mapping

from gpuops.command import Cmd
from gpuops.errors import CommandTimeout, ConnectError, GpuopsError
from gpuops.targets import Host
from gpuops.transport.base import Result
from gpuops.transport.local import ProcStream
from gpuops.transport.ssh.connecting import Connecting, ConnectionLost
from gpuops.transport.ssh.openssh.argv import SshPlan, master_alive, plan
from gpuops.transport.ssh.openssh.fail import SshFailed, classify
from gpuops.transport.ssh.plan import where

_HINTS = {
    "refused": "check the address and port in the inventory, and that sshd is running (GPUOPS_CONNECT_RETRY_TIME "
               "makes gpuops wait for a host that is coming up)",
    "resolve": "check the address in the inventory, or the Host entry in ~/.ssh/config",
}


class _Master:
    """The master the commands go through; gpuops never stops it on close (ControlPersist ends it)."""

    def __init__(self, plan: SshPlan, new: bool) -> None:
        self.plan = plan
        self.new = new

    def close(self) -> None:
        return None


class OpenSshTransport(Connecting[_Master]):
    """One SSH host, reached with the `ssh` binary at `ssh`; connected lazily, once, reused across commands."""

    def __init__(self, host: Host, hosts: Mapping[str, Host], *, ssh: str, retry_time: float = 30.0,
                 wait_refused: bool = False) -> None:
        super().__init__(host, retry_time=retry_time)
        self.hosts = hosts
        self.ssh = ssh
        self.wait_refused = wait_refused  # a refused first connect is retried (GPUOPS_CONNECT_RETRY_TIME given)
        self._reached = False  # once the host answered, a refused connect is a restart: retried

    def wrap(self, cmd: Cmd) -> Cmd:
        return cmd

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return cmd.render(display=display)

    # -- connection ------------------------------------------------------------------

    def _active(self) -> bool:
        path = self._conn.plan.control_path if self._conn is not None else None
        return path is not None and (not path or master_alive(path))

    def _made(self, conn: Any) -> int:
        return 1 if conn.new else 0

    def _transient(self, exc: BaseException) -> bool:
        return isinstance(exc, SshFailed) and (exc.transient or (exc.refused and self._reached))

    def _failure(self, exc: BaseException) -> GpuopsError | None:
        if not isinstance(exc, SshFailed):
            return None
        retried = self._transient(exc) and self.retry_time > 0
        if retried:
            tail = f" (gave up after {self.retry_time:g}s of retries)"
        elif exc.refused:
            tail = " (nothing listens on that port; not retried)"
        else:
            tail = ""
        hint = _HINTS["resolve"] if exc.why.startswith("could not resolve") else _HINTS["refused"]
        return ConnectError(exc.label or self.label, f"cannot connect to {exc.where or where(self.host)}: {exc.why}{tail}",
                            hint=hint)

    def _connect_once(self) -> _Master:
        found = plan(self.ssh, self.host, self.hosts)
        try:
            if not found.control_path:
                master = self._start_master(found)
            else:
                with _lock(found.control_path + ".lock"):
                    if master_alive(found.control_path):
                        master = _Master(found, new=False)
                    else:
                        master = self._start_master(found)
        finally:
            for log in found.hop_logs:
                _unlink(log)
        self._reached = True
        return master

    def _start_master(self, found: SshPlan) -> _Master:
        """The master made (or, without one, the first login made), once it is up; else why not."""
        if found.control_path and os.path.exists(found.control_path):
            _unlink(found.control_path)  # a stale socket (its master was killed), as ssh itself removes one
        budget = self.host.connect_timeout * (2 + len(found.hops)) + 5
        with tempfile.TemporaryFile(dir=found.folder) as said:
            # stderr to a file, not a pipe: a jump's ProxyCommand process inherits it and outlives this call.
            proc = subprocess.Popen(found.master(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=said,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                _kill(proc)
                raise SshFailed(f"no SSH connection within {budget:g}s", transient=True) from None
            said.seek(0)
            text = said.read().decode("utf-8", "replace")
        if code == 0 and (not found.control_path or master_alive(found.control_path)):
            return _Master(found, new=True)
        raise self._why(found, text)

    def _why(self, found: SshPlan, text: str) -> Exception:
        """The error of the first jump whose ssh says why (its own log), else what the host's ssh said."""
        for hop, log in zip(found.hops, found.hop_logs, strict=False):  # the jumps have logs, the host not
            error = classify(_read(log), hop, connect_timeout=self.host.connect_timeout, wait_refused=self.wait_refused)
            if isinstance(error, GpuopsError):
                return error
            if error.kind in ("refused", "resolve", "network"):
                error.label, error.where = hop.label, hop.key_name
                return error
        error = classify(text, found.hops[-1], connect_timeout=self.host.connect_timeout, wait_refused=self.wait_refused)
        if isinstance(error, SshFailed):
            error.label, error.where = self.label, where(self.host)
        return error

    def reconnect(self) -> None:
        """A new master: gpuops' own stops taking commands first (those running finish); the user's is left alone."""
        conn = self._conn
        if conn is not None and conn.plan.ours and conn.plan.control_path:
            try:
                subprocess.run(conn.plan.stop(), stdin=subprocess.DEVNULL, capture_output=True, timeout=5,
                               start_new_session=True)
            except subprocess.TimeoutExpired:
                pass
            _unlink(conn.plan.control_path)
        super().reconnect()

    def _ready(self) -> SshPlan:
        self.connect()
        if not self._active():
            self.reconnect()
        assert self._conn is not None
        return self._conn.plan

    # -- commands --------------------------------------------------------------------

    def _count(self, found: SshPlan) -> None:
        self.commands += 1
        if not found.control_path:
            self.connections_made += 1  # no master: each command is a login of its own

    def run(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None, _again: bool = False) -> Result:
        found = self._ready()
        self._count(found)
        log = found.new_log()
        proc = subprocess.Popen([*found.command(log=log), cmd.render()], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, start_new_session=True)
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)  # the master holds our pipes until the remote command ends: do not wait to drain them
            raise CommandTimeout(f"{self.label}: a remote command ran past {timeout:g}s; its ssh was stopped") from None
        finally:
            said = _read(log, unlink=True)
        if proc.returncode == 255 and _lost(found, said):
            if not _again and _never_started(said, found):
                # A master of an earlier gpuops command outlived its host's link: the command never reached the
                # host, so it is safe to run again once a new connection is up (retried as any connect is).
                self.reconnect()
                return self.run(cmd, timeout=timeout, stdin=stdin, _again=True)
            raise ConnectionLost(self.label, f"connection lost ({_first(said) or 'the master connection ended'})")
        return Result(proc.returncode, out, err)

    def open(self, cmd: Cmd) -> "SshProcStream":
        found = self._ready()
        self._count(found)
        log = found.new_log()
        proc = subprocess.Popen([*found.command(log=log), cmd.render()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        return SshProcStream(proc, found, log)


class SshProcStream(ProcStream):
    """A command through the master, its stderr merged into stdout; ssh's own words in its log."""

    def __init__(self, proc: subprocess.Popen[bytes], found: SshPlan, log: str) -> None:
        super().__init__(proc)
        self._plan = found
        self._log = log
        self._lost: bool | None = None

    def wait(self, timeout: float) -> int | None:
        """The command's exit status; -1 when the connection dropped (ssh's own 255, not the command's)."""
        try:
            code = self._proc.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            return None
        return -1 if self.connection_lost() else code

    def connection_lost(self) -> bool:
        if self._proc.poll() != 255:
            return False
        if self._lost is None:
            self._lost = _lost(self._plan, _read(self._log))
        return self._lost

    def close(self) -> None:
        self.close_stdin()
        if self._proc.poll() is None:
            _kill(self._proc, signal.SIGTERM)
        if self._proc.stdout:
            self._proc.stdout.close()
        _unlink(self._log)


def _lost(found: SshPlan, said: str) -> bool:
    """ssh exited 255: its own failure when it said why or the master is gone; else the command's own status."""
    return bool(said.strip()) or (bool(found.control_path) and not master_alive(found.control_path))


def _first(said: str) -> str:
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """End ssh (its own session: Ctrl-C here never reaches it) and reap it, leaving its pipes unread."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


class _lock:
    """An exclusive lock file beside a master's socket: two gpuops processes never both start one."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def _read(path: str, *, unlink: bool = False) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        if unlink:
            _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _never_started(said: str, found: SshPlan) -> bool:
    """ssh's own words say it could not connect at all (refused, no route, timed out): no command ran."""
    error = classify(said, found.hops[-1], connect_timeout=1.0, wait_refused=False)
    return isinstance(error, SshFailed) and error.kind in ("refused", "network")
