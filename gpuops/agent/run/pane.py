"""The training on a terminal of its own inside its tmux pane, every byte it prints copied to the log.

`python3 -m gpuops_agent pane RUN_ID WORKDIR [COMMAND_FILE]` (run by sh/run.sh in the pane) runs the run's command
(`bash -c COMMAND`, in WORKDIR; the command is read from the run directory, so that only the training's
own process shows it, as before). The training gets a
new pseudo-terminal (its stdin, stdout and stderr; isatty() is True, tqdm draws its bar, pdb and
breakpoint() read what is typed). This relay copies what the training writes, byte for byte, to the
log first (the watchdog's input: the stall clock counts carriage returns too) and then to the pane
(`tmux attach` shows it live, with scrollback), and passes what is typed in the pane to the training.
The training's terminal does no output processing (no newline turned into CR LF), so the log holds
exactly what it wrote; the pane's terminal does that for display.

A Ctrl-C typed in the pane is delivered as a terminal delivers it (SIGINT to the training's foreground
job) without echoing `^C` into the log. If the training then ends within the run's abort grace and
nobody else stopped the run, the relay records the end as an interruption from the pane: abort.json
with `reason: interrupt`, `by: pane` (the watchdog finishes the sequence: reap, drain), so the run is
`interrupted` (exit 130), not failed. A signal sent to the pane's job (the abort's SIGTERM, say) is
passed on to the training's; the pane hanging up (its session killed) sends the training SIGHUP, as a
terminal does, and the log keeps receiving what it writes until it ends. Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import sys
import termios
import time
from typing import Any, List, Optional

from ..wire import protocol as p
from ..wire import watchfile
from .abort import claim

READ = 1 << 16
#: Pane output held while the pane does not take it (a stopped tmux): beyond this the oldest is dropped
#: (the log never is).
PANE_BACKLOG = 1 << 20
#: After the training ended, what it wrote last is read until the terminal is quiet this long.
DRAIN_QUIET = 0.05
#: Signals passed on to the training's foreground job (SIGHUP is the pane's hangup, handled apart).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue


def _size(fd: int) -> Optional[bytes]:
    try:
        return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
    except OSError:
        return None


def _unprocessed(fd: int) -> None:
    """No output processing on the training's terminal: the bytes read from it are the bytes written."""
    attrs = termios.tcgetattr(fd)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(fd, termios.TCSANOW, attrs)


def _raw_input(fd: int) -> Optional[list]:
    """The pane's terminal passes each typed byte through (the training's terminal edits lines and echoes);
    its output processing stays on, for display. The previous settings, to restore."""
    try:
        old = termios.tcgetattr(fd)
    except termios.error:
        return None
    new: List[Any] = [list(x) if isinstance(x, list) else x for x in old]  # termios' mixed list
    new[0] &= ~(termios.IGNBRK | termios.BRKINT | termios.PARMRK | termios.ISTRIP | termios.INLCR | termios.IGNCR
                | termios.ICRNL | termios.IXON)
    new[3] &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    new[6][termios.VMIN], new[6][termios.VTIME] = 1, 0
    try:
        termios.tcsetattr(fd, termios.TCSANOW, new)
    except termios.error:  # hung up already: nothing is typed there
        return None
    return old


def spawn(argv: List[str], cwd: str, size: Optional[bytes]) -> "tuple[int, int]":
    """(pid, master): argv in cwd on a new terminal, in a session of its own (its controlling terminal)."""
    master, slave = os.openpty()
    _unprocessed(slave)
    if size is not None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child execs
        try:
            os.close(master)
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(slave, fd)
            if slave > 2:
                os.close(slave)
            for sig in FORWARDED + (signal.SIGWINCH, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            os.chdir(cwd)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, ("gpuops: cannot run %s in %s: %s\n" % (argv[0], cwd, exc.strerror)).encode())
        os._exit(127)
    os.close(slave)
    return pid, master


class Relay:
    """One training on its terminal, its output to the log and the pane, the pane's input to it."""

    def __init__(self, d: str, pid: int, master: int, pane: Optional[int], log: int) -> None:
        self.d, self.pid, self.master, self.pane, self.log = d, pid, master, pane, log
        self.backlog = bytearray()
        self.status: Optional[int] = None
        self.interrupted_at: Optional[float] = None  # a Ctrl-C typed in the pane, last
        self.hup_sent = False
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.master, self.wake_r, self.wake_w) + ((pane,) if pane is not None else ()):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    # -- what comes in --------------------------------------------------------------------------
    def on_signal(self, signum: int) -> None:
        if signum == signal.SIGCHLD:
            return
        if signum == signal.SIGWINCH:
            size = _size(self.pane) if self.pane is not None else None
            if size is not None:
                try:
                    fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)  # the training gets its SIGWINCH
                except OSError:
                    pass
            return
        if signum == signal.SIGHUP:
            self.hup_sent = True  # a hangup of the pane that comes with it sends no second one
        self.signal_job(signum)

    def signal_job(self, signum: int) -> None:
        """The signal to the training's foreground job (its process group, where it cannot be read)."""
        try:
            group = os.tcgetpgrp(self.master)
        except OSError:
            group = self.pid
        for target in {group if group > 0 else self.pid, self.pid}:
            try:
                os.killpg(target, signum)
            except OSError:
                pass

    def from_pane(self) -> None:
        try:
            data = os.read(self.pane, READ) if self.pane is not None else b""
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.hung_up()
            return
        intr = self._intr()
        if intr is not None and intr in data:
            before, _, after = data.partition(intr)
            self.to_job(before)
            self.interrupted_at = time.time()
            self.to_pane(b"^C")  # what a terminal shows; the log gets no ^C
            self.signal_job(signal.SIGINT)
            try:
                termios.tcflush(self.master, termios.TCIFLUSH)  # as the terminal does on an interrupt
            except termios.error:
                pass
            self.to_job(after.replace(intr, b""))
            return
        self.to_job(data)

    def _intr(self) -> Optional[bytes]:
        """The training's interrupt character while its terminal turns it into SIGINT; else None."""
        try:
            attrs = termios.tcgetattr(self.master)
        except termios.error:
            return None
        if not attrs[3] & termios.ISIG:
            return None
        c = attrs[6][termios.VINTR]
        c = c if isinstance(c, bytes) else bytes([c])
        return c if c != b"\0" else None

    def to_job(self, data: bytes) -> None:
        if data:
            try:
                os.write(self.master, data)
            except OSError:  # the training reads nothing (its input is full) or is gone: typing is lost
                pass

    def hung_up(self) -> None:
        """The pane is gone (its session killed): SIGHUP to the training, as a terminal's hangup sends; the
        log goes on receiving what it writes."""
        if self.pane is not None:
            os.close(self.pane)
            self.pane = None
            self.backlog.clear()
            if not self.hup_sent:
                self.hup_sent = True
                self.signal_job(signal.SIGHUP)

    # -- what goes out --------------------------------------------------------------------------
    def from_job(self) -> bool:
        """Copy what the training wrote; False once its terminal is closed by every writer."""
        try:
            data = os.read(self.master, READ)
        except BlockingIOError:
            return True
        except OSError as exc:
            if exc.errno == errno.EIO:
                return False
            raise
        if not data:
            return False
        _write_all(self.log, data)
        self.to_pane(data)
        return True

    def to_pane(self, data: bytes) -> None:
        if self.pane is None:
            return
        self.backlog += data
        if len(self.backlog) > PANE_BACKLOG:
            del self.backlog[:len(self.backlog) - PANE_BACKLOG]
        self.flush_pane()

    def flush_pane(self) -> None:
        try:
            while self.backlog and self.pane is not None:
                n = os.write(self.pane, self.backlog)
                del self.backlog[:n]
        except BlockingIOError:
            pass
        except OSError:
            self.hung_up()

    # -- the loop -------------------------------------------------------------------------------
    def reaped(self) -> bool:
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid == self.pid:
                self.status = _code(status)
        return self.status is not None

    def run(self) -> int:
        open_ = True
        while open_ and not self.reaped():
            poller = select.poll()
            poller.register(self.master, select.POLLIN)
            poller.register(self.wake_r, select.POLLIN)
            if self.pane is not None:
                poller.register(self.pane, select.POLLIN | (select.POLLOUT if self.backlog else 0))
            try:
                ready = dict(poller.poll(1000))
            except InterruptedError:
                continue
            if self.wake_r in ready:
                for signum in os.read(self.wake_r, 512):
                    self.on_signal(signum)
            if self.pane is not None and self.pane in ready:
                if ready[self.pane] & select.POLLOUT:
                    self.flush_pane()
                if self.pane is not None and ready[self.pane] & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    self.from_pane()
            if self.master in ready:
                open_ = self.from_job()
        while not self.reaped():
            time.sleep(0.01)  # its terminal closed: the training is ending
        self.drain()
        return self.status if self.status is not None else 1

    def drain(self) -> None:
        """What the training wrote before it ended; its own children may hold its terminal: read until quiet."""
        while select.select([self.master], [], [], DRAIN_QUIET)[0]:
            try:
                if not self.from_job():
                    return
            except OSError:
                return

    def record_interrupt(self, grace: float) -> bool:
        """A Ctrl-C typed in the pane, then the end within the grace, nobody else stopping the run: the
        claim says so (by: pane). The watchdog finishes the sequence (no second signal)."""
        at = self.interrupted_at
        if at is None or time.time() - at > grace or os.path.exists(os.path.join(self.d, p.ABORT)):
            return False
        record = {"reason": "interrupt", "by": "pane", "signal": "INT", "grace": grace, "pid": os.getpid(),
                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)), "command_exit_code": self.status}
        try:
            won, _ = claim(self.d, record)
            if won:
                with open(os.path.join(self.d, p.ABORT_SIGNALLED), "w") as fh:
                    fh.write("%.3f\n" % at)
            return won
        except OSError:
            return False


def _code(status: int) -> int:
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _pane_fd() -> Optional[int]:
    """The pane's terminal, opened anew (its own non-blocking flag; the shell's stays as it is)."""
    for fd in (0, 1):
        if os.isatty(fd):
            try:
                return os.open(os.ttyname(fd), os.O_RDWR | os.O_NOCTTY)
            except OSError:
                return None
    return None


def main(argv: List[str]) -> int:
    try:
        return _main(argv)
    except Exception as exc:  # said where the run's reader looks, and in the pane; the exit code says it failed
        import traceback

        said = "gpuops: the pane relay failed: %s: %s\n" % (type(exc).__name__, exc)
        traceback.print_exc()
        if len(argv) > 0:
            try:
                with open(os.path.join(p.run_dir(argv[0]), p.LOG), "ab") as fh:
                    fh.write(said.encode())
            except OSError:
                pass
        sys.stderr.write(said)
        return 125


def _main(argv: List[str]) -> int:
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: python3 -m gpuops_agent pane RUN_ID WORKDIR [COMMAND_FILE]\n")
        return 2
    run_id, cwd = argv[:2]
    d = p.run_dir(run_id)
    # COMMAND_FILE: the attempt's command (restart.command's file from the second attempt on), else launch's.
    with open(argv[2] if len(argv) == 3 else os.path.join(d, p.COMMAND), "rb") as fh:
        command = ["bash", "-c", fh.read().decode("utf-8", "surrogateescape")]
    log = os.open(os.path.join(d, p.LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    pane = _pane_fd()
    pid, master = spawn(command, cwd, _size(pane) if pane is not None else None)
    relay = Relay(d, pid, master, pane, log)
    signal.set_wakeup_fd(relay.wake_w)
    for sig in FORWARDED + (signal.SIGWINCH, signal.SIGCHLD):
        signal.signal(sig, lambda *a: None)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    saved = _raw_input(pane) if pane is not None else None
    try:
        code = relay.run()
    finally:
        if saved is not None and relay.pane is not None:
            try:
                termios.tcsetattr(relay.pane, termios.TCSANOW, saved)
            except termios.error:
                pass
    if relay.record_interrupt(watchfile.read_or_default(d).abort.grace) and relay.pane is not None:
        relay.to_pane(b"\r\ngpuops: Ctrl-C typed here ended run %s (recorded as interrupted, by: pane)\r\n"
                      % run_id.encode())
    return code


tool_pane = main
