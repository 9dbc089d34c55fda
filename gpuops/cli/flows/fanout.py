"""Several targets at once: each in a process of its own, its events relayed here and rendered together.

A target's work (launch, follow, stop) runs as it does for one target, in the main thread of a forked
worker: its own connection, its own Ctrl-C handling, the regex time budget (a SIGALRM, main thread
only) intact, and no dead host or stuck regex of one target can stall another. This process renders
every event, writes the JUnit report, and passes Ctrl-C and SIGTERM on to each worker once. The
command's exit code is the worst of the targets' (errors.worst_exit); every target's result is reported.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn

from gpuops.cli.signals import cause_of, code_of, outcome_of
from gpuops.client.events import Event, Outcome
from gpuops.errors import ExitCode, GpuopsError, severity, worst_exit

if TYPE_CHECKING:
    from gpuops.cli.roles import Render, Report, Terminal
    from gpuops.client.play import Play

Work = Callable[["Play", "Render"], int]  # (play, renderer) -> exit code; a GpuopsError is that target's error
_HEADER = struct.Struct("!I")
_CARRIED = ("findings", "thresholds", "gpu", "tail", "run", "target")  # what the renderers and the report read


class Carried(GpuopsError):
    """A target's error as its worker raised it: message, hint, exit code and the details shown with it."""

    def __init__(self, message: str, hint: str | None, exit_code: int, details: dict[str, Any]) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code
        self.__dict__.update(details)


@dataclass
class _Worker:
    play: Play
    pid: int
    fd: int
    buf: bytearray = field(default_factory=bytearray)
    items: list[Any] = field(default_factory=list)  # relayed, not yet rendered (ordered output)
    code: int | None = None
    word: str = ""
    cost: tuple[int, int] = (0, 0)
    eof: bool = False
    signalled: set[int] = field(default_factory=set)  # the signals passed on to it (each once)

    @property
    def name(self) -> str:
        return self.play.target.name


class _Relay:
    """The renderer a worker's work sees: every event and outcome goes, pickled, to the rendering process."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, item: tuple[Any, ...]) -> None:
        data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(_HEADER.pack(len(data)) + data)
        with _signals_held():  # a frame is written whole, or the reader could not tell where the next begins
            try:
                while view:
                    view = view[os.write(self.fd, view):]
            except OSError:  # the rendering process is gone: end as a killed gpuops would
                os._exit(ExitCode.INTERNAL)

    def event(self, ev: Event) -> None:
        self.send(("event", ev))

    def outcome(self, out: Outcome, target: str | None = None) -> None:
        self.send(("outcome", out))


class Fanout:
    """Runs `work` for every play at once and renders what each reports; `ordered`: one target's output after another."""

    def __init__(self, plays: list[Play], render_for: Callable[[Play], Render], base: Terminal, report: Report, *,
                 as_json: bool, ordered: bool = False, sum_up: bool = True) -> None:
        self.plays, self.base, self.report = plays, base, report
        self.as_json, self.ordered = as_json, ordered
        self.sum_up = sum_up  # False: the caller says the last word (a torchrun job's summary, cli/flows/job_flow.py)
        self.renders = {play.target.name: render_for(play) for play in plays}
        self.workers: list[_Worker] = []
        self.broken = False

    # -- the workers ------------------------------------------------------------------------------
    def run(self, work: Work) -> int:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # a forked copy of unwritten output would be written twice
        me = os.getpid()
        for play in self.plays:
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in [read_end] + [w.fd for w in self.workers]:
                    os.close(fd)
                _worker_main(play, work, write_end, me)
            os.close(write_end)
            self.workers.append(_Worker(play, pid, read_end))
        try:
            with self._passing_signals_on():
                self._pump()
        finally:
            for w in self.workers:
                os.close(w.fd)
        return self._finish()

    def _pump(self) -> None:
        while any(not w.eof for w in self.workers):
            try:
                live = [w.fd for w in self.workers if not w.eof]
                ready, _, _ = select.select(live, [], [], 0.5)
                for w in self.workers:
                    if w.fd in ready:
                        self._read(w)
                self._render()
            except BrokenPipeError:  # stdout's reader left: stop following everywhere, say nothing more
                self.broken = True
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                self._signal(signal.SIGINT)

    @contextlib.contextmanager
    def _passing_signals_on(self) -> Iterator[None]:
        """While the workers run, Ctrl-C, SIGTERM and SIGHUP here are passed on to them and raise nothing here.

        Each target ends as it would alone, and this process waits for every result. A handler that
        raised (KeyboardInterrupt) could be hit again by a second Ctrl-C while it passed the first on,
        a CI `timeout` sends two at once, and the pump would end with the workers still cleaning up."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) != signal.SIG_IGN:  # one ignored from the start (a background job) stays so
                previous[sig] = signal.signal(sig, lambda signum, frame: self._signal(signum))
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _signal(self, sig: int) -> None:
        """Pass the signal on to each worker once: a second Ctrl-C (a CI `timeout` sends two) must not
        cut short the cleanup the first one started there. Signals are held meanwhile, so a handler
        run again inside this one cannot send one twice."""
        with _signals_held():
            for w in self.workers:
                if not w.eof and sig not in w.signalled:
                    w.signalled.add(sig)
                    try:
                        os.kill(w.pid, sig)
                    except ProcessLookupError:
                        pass

    def _read(self, w: _Worker) -> None:
        data = os.read(w.fd, 1 << 20)
        if data:
            w.buf += data
            self._frames(w)
        else:
            self._ended(w)

    def _frames(self, w: _Worker) -> None:
        while len(w.buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(w.buf)
            if len(w.buf) < _HEADER.size + size:
                break
            item = pickle.loads(bytes(w.buf[_HEADER.size:_HEADER.size + size]))
            del w.buf[:_HEADER.size + size]
            if item[0] in ("done", "error"):
                w.code = item[1] if item[0] == "done" else item[1]["exit_code"]
            w.items.append(item)

    def _ended(self, w: _Worker) -> None:
        w.eof = True
        _, status = os.waitpid(w.pid, 0)
        if w.code is None:  # it died without a word (killed, out of memory)
            code = os.waitstatus_to_exitcode(status)
            why = f"signal {-code}" if code < 0 else f"exit {code}"
            w.items.append(("error", _carry(GpuopsError(f"{w.name}: its worker process ended without a result ({why})")),
                            (0, 0)))
            w.code = ExitCode.INTERNAL

    # -- rendering --------------------------------------------------------------------------------
    def _render(self) -> None:
        for w in self.workers:
            while w.items:
                self._show(w, w.items.pop(0))
            if self.ordered and not w.eof:
                return  # the next target's output waits until this one's is all out

    def _show(self, w: _Worker, item: tuple[Any, ...]) -> None:
        render = self.renders[w.name]
        kind = item[0]
        if kind == "event":
            render.event(item[1])
        elif kind == "outcome":
            w.word = item[1].outcome
            render.outcome(item[1], w.name)
        elif kind == "error":
            exc = Carried(**item[1])
            w.word, w.cost = "error", item[2]
            self._error(w.name, exc)
        elif kind == "done":
            w.cost = item[2]

    def _error(self, name: str, exc: Carried) -> None:
        from gpuops.cli.options import error_outcome
        from gpuops.cli.renderers.render import JsonRenderer

        if self.report.path:
            self.report.suite(name).error(exc, exc.exit_code)
        if isinstance(self.base, JsonRenderer):  # --json
            self.base.outcome(error_outcome(exc.exit_code, "error", str(exc), exc.hint, exc), name)
        else:
            self.base.error(name, exc.exit_code, str(exc), exc.hint, exc)

    def _finish(self) -> int:
        self._render()
        codes = [w.code if w.code is not None else ExitCode.INTERNAL for w in self.workers]
        code = worst_exit(codes)
        if self.broken:
            raise BrokenPipeError()
        if not self.sum_up:
            return code
        from gpuops.cli.renderers.render import JsonRenderer

        if isinstance(self.base, JsonRenderer):  # --json
            order = {w.name: i for i, w in enumerate(self.workers)}
            self.base.release(lambda obj: (severity(obj.get("exit_code", 1)), order.get(str(obj.get("target")), 0)))
        else:
            each = ", ".join(f"{w.name} {w.word or 'ended'} (exit {c})"
                             for w, c in zip(self.workers, codes, strict=True))
            self.base.say(f"gpuops: {len(self.workers)} targets: {each}; exit {code}" + (", the worst" if len(set(codes)) > 1 else ""))
        return code

    def cost(self) -> tuple[int, int]:
        """SSH connections and remote commands over every worker (for -v)."""
        return sum(w.cost[0] for w in self.workers), sum(w.cost[1] for w in self.workers)


def _carry(exc: GpuopsError) -> dict[str, Any]:
    """The error as plain data (its class may not pickle): what Carried rebuilds."""
    details = {k: getattr(exc, k) for k in _CARRIED if getattr(exc, k, None) is not None}
    return {"message": str(exc), "hint": exc.hint, "exit_code": exc.exit_code, "details": details}


def _cost(play: Play) -> tuple[int, int]:
    return play.transport.connections_made, play.transport.commands


def _worker_main(play: Play, work: Work, fd: int, parent: int) -> NoReturn:
    """In the forked worker: run the work for one target, relay everything, never return."""
    from gpuops.cli.options import internal_error

    try:
        os.setpgid(0, 0)  # the terminal's Ctrl-C reaches the renderer, which passes it on exactly once
    except OSError:
        pass
    _die_with(parent)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # stdout is the renderer's alone
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the renderer's Ctrl-C, passed on, even where
    # gpuops was started with SIGINT ignored (a background job of a script)
    relay = _Relay(fd)
    try:
        code = work(play, relay)
        relay.send(("done", code, _cost(play)))
    except GpuopsError as exc:
        exc.target = exc.target or play.target.name
        relay.send(("error", _carry(exc), _cost(play)))
    except KeyboardInterrupt as exc:  # before or after the work's own handling: still one result
        code, name = code_of(exc), play.target.name
        relay.outcome(Outcome(outcome_of(exc), code, f"{cause_of(exc)} while at work on {name}: see `gpuops status -t {name}`", {}))
        relay.send(("done", code, _cost(play)))
    except BaseException as exc:  # noqa: BLE001 - a bug in one target's work must not take the others down
        message, hint = internal_error(exc)
        relay.send(("error", _carry(GpuopsError(message, hint=hint)), _cost(play)))
    finally:
        os._exit(0)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP wait (the OS keeps them pending) while the block runs."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _die_with(parent: int) -> None:
    """Linux: the worker is killed with the rendering process (a SIGKILLed gpuops leaves no worker behind)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the line above
        os._exit(ExitCode.INTERNAL)
