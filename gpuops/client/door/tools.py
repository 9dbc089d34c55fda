"""The one door to a target's agent: every agent tool the client runs, and the typed reply it reads back.

A method is named as the tool it runs (gpuops/agent/__main__.py, agent/sh/), so one exchange has one
name on both sides. A tool that finds gpuops' files missing on the target gets them (bundle.py) and
runs again; nothing outside this package sees a tool's raw output.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from gpuops.agent.wire import marks
from gpuops.agent.wire import protocol as p
from gpuops.agent.wire.hostwire import HostWatchReply, XidsReply, parse_host_watch, parse_xids
from gpuops.agent.wire.smi import SmiError, parse_sample
from gpuops.client.door import commands
from gpuops.client.door.bundle import ToolCmd, bundle, check_installed, install, needs_lib, with_install
from gpuops.client.door.channels import FollowChannel, LockChannel, WarmupChannel
from gpuops.client.door.replies import MemoryReading, read_report, read_runs
from gpuops.command import Cmd
from gpuops.errors import (
    AuthError,
    CommandTimeout,
    ConnectError,
    GpuopsError,
    HostKeyError,
    NoRun,
    RemoteError,
    RunAlive,
    RunStopped,
    TargetNotReady,
)
from gpuops.transport.base import Result, Transport

ABORT_PERSISTENCE = 300.0  # seconds an abort keeps trying through a lost connection


class Door:
    """The door to gpuops' agent on one target, reached through `transport`; `label` names the target in messages
    and `mask` hides the playbook's secrets in them."""

    def __init__(self, transport: Transport, *, label: str | None = None,
                 mask: Callable[[str], str] | None = None) -> None:
        self.transport = transport
        self.label = label or transport.label
        self.mask = mask
        self._installed = False  # a tool ran there: gpuops' files are in place

    @property
    def timeout(self) -> float:
        """Seconds for one short tool."""
        return self.transport.command_timeout

    # -- the files and the round trip ---------------------------------------------------------------------
    def install(self) -> None:
        """Copy gpuops' target package to the target unless its digest's folder is there already."""
        install(self.transport, timeout=max(self.timeout, 60.0), label=self.label, mask=self.mask)
        self._installed = True

    def _run(self, cmd: Cmd, *, timeout: float | None = None, stdin: bytes | None = None) -> Result:
        """`cmd` on the target; its result once the files are there."""
        timeout = timeout or self.timeout
        result = self.transport.run(cmd, timeout=timeout, stdin=stdin)
        if needs_lib(result):
            install(self.transport, timeout=max(timeout, 60.0), label=self.label, mask=self.mask)
            result = self.transport.run(cmd, timeout=timeout, stdin=stdin)
        self._installed = self._installed or isinstance(cmd, ToolCmd)
        return result

    def _open(self, cmd: Cmd) -> Any:
        """A streaming tool (its files are made sure of first: a stream cannot be re-run)."""
        if not self._installed:
            self.install()
        return self.transport.open(cmd)

    def _persistently(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None,
                      budget: float = ABORT_PERSISTENCE) -> Result:
        """An idempotent tool (abort, kill_marked) through dropped connections: a run must not survive
        because the link blinked between the match and the abort. Host-key and authentication errors
        are not retried."""
        deadline = time.monotonic() + budget
        while True:
            try:
                return self._run(cmd, timeout=timeout, stdin=stdin)
            except (ConnectError, CommandTimeout) as exc:
                if isinstance(exc, (HostKeyError, AuthError)) or time.monotonic() >= deadline:
                    raise
                time.sleep(1.0)  # the next run reconnects, retrying transient errors itself

    def _said(self, text: str) -> str:
        return self.mask(text) if self.mask else text

    def _check(self, result: Result, what: str) -> None:
        if result.exit_code != 0:
            raise RemoteError(f"{self.label}: could not {what} (exit {result.exit_code}): "
                              f"{self._said(result.err.strip())[-400:]}")

    # -- the tools ----------------------------------------------------------------------------------------
    def probe(self, sessions: tuple[str, ...] | None = None, *, health: bool = False) -> marks.ProbeReply:
        """Clock, GPUs, tools and the sessions' runs (probe.sh; `health`: the GPUs' health fields too);
        ContainerNotRunning for a container that is down."""
        result = self._run(commands.probe(sessions, health=health))
        if result.exit_code != 0 and self.transport.container is not None:
            self.transport.container.raise_for_container(result.err)
        return marks.parse_probe(result.out)

    def probe_with_state(self, sessions: tuple[str, ...] | None) -> tuple[marks.ProbeReply | None, str | None]:
        """The probe with GPU samples, and a container's state in the same round trip (None on a host);
        where gpuops' files are missing, copied and run again in one more. No probe when the container is down."""
        cmd = commands.probe(sessions, samples=True, python=False)
        container = self.transport.container

        def run(cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> tuple[Result, str | None]:
            if container is not None:
                return container.run_with_state(cmd, timeout=timeout, stdin=stdin)
            return self.transport.run(cmd, timeout=timeout, stdin=stdin), None
        result, state = run(cmd, timeout=self.timeout)
        if needs_lib(result):
            result, state = run(with_install(cmd), timeout=max(self.timeout, 60.0), stdin=bundle().zip)
            check_installed(result, label=self.label, after=True)
        return (marks.parse_probe(result.out) if state in (None, "running") else None), state

    def lock(self, session: str, holder: str, gpus: tuple[int, ...], *, health: bool = False) -> LockChannel:
        """The launch lock of the session and its GPUs (lock.sh), held open: wait_locked() reads its verdict
        (`health`: the probe under the lock reads the GPUs' health too)."""
        return LockChannel(self._open(commands.lock(session, holder, gpus, health=health)), self.transport, self.label)

    # -- the host (the Proxmox host of a container, or the target itself): its kernel log ----------------------
    def xids(self, window: float) -> XidsReply:
        """The Xids of the host's kernel log in the last `window` seconds, or why it cannot be read (run this
        on the host's door: Play.host_door)."""
        result = self._run(commands.xids(window), timeout=max(self.timeout, 60.0))
        reply = parse_xids(result.out)
        if result.exit_code != 0 and not reply.readable:
            reply.why = f"the host's tool failed (exit {result.exit_code}): {self._said(result.err.strip())[-300:]}"
        return reply

    def host_watch(self, spec: bytes) -> HostWatchReply:
        """Start the host's kernel-log follower for a run (the spec on stdin); its pid, or why it does not follow."""
        result = self._run(commands.host_watch(), stdin=spec, timeout=max(self.timeout, 60.0))
        reply = parse_host_watch(result.out)
        if reply.off is not None and result.exit_code != 0:
            reply.off += f" (exit {result.exit_code}: {self._said(result.err.strip())[-200:]})"
        return reply

    def forget_lock(self, session: str, holder: str, gpus: tuple[int, ...]) -> None:
        """Take a launcher's name off its lock files (lock.sh --forget)."""
        self._run(commands.forget_lock(session, holder, gpus))

    def prepare(self, run_id: str, spec: bytes) -> None:
        """The run directory, from one JSON document on stdin (env values of any size)."""
        result = self._run(commands.prepare(run_id), stdin=spec)
        if result.exit_code == marks.CANNOT_CREATE_EXIT:
            raise TargetNotReady(f"{self.label}: {self._said(result.err.strip())[-300:]}",
                                 hint="the run directory lives under ~/.gpuops in the target user's home: make it writable")
        self._check(result, "create the run directory")

    def record(self, run_id: str, name: str, record: dict[str, Any]) -> None:
        """Rewrite one JSON record of the run."""
        self._run(commands.record(run_id, name), stdin=commands.dumps(record).encode())

    def start(self, run_id: str, session: str) -> marks.StartReply:
        """The watchdog starts and answers; then training starts in tmux. Raises when it did not start."""
        result = self._run(commands.start(run_id), timeout=max(self.timeout, 90.0))
        said = marks.parse_start(result.out)
        if said.stopped:
            raise RunStopped(f"{self.label}: the launch was stopped by `gpuops stop` before training started")
        if said.session_exists:
            raise RunAlive(f"{self.label}: tmux session '{session}' appeared during the launch", hint="see `gpuops status`")
        if said.watchdog_failed is not None:
            raise TargetNotReady(f"{self.label}: the watchdog could not start, so training was not started: "
                                 f"{self._said(said.watchdog_failed)}",
                                 hint=f"its log is ~/.gpuops/runs/{run_id}/{p.WATCHDOG_LOG}")
        if not said.started:
            self._check(result, "start the tmux session")
            raise RemoteError(f"{self.label}: the tmux session '{session}' did not start: "
                              f"{self._said(result.err.strip())[-400:]}")
        return said

    def abort(self, run_id: str, by: str, record: dict[str, Any], *, timeout: float) -> marks.AbortReply:
        """The one abort sequence, repeated through reconnects until it reports the end: who won the claim,
        what was left."""
        result = self._persistently(commands.abort(run_id, by), timeout=timeout, stdin=json.dumps(record).encode())
        return marks.parse_abort(result.out, {**record, "by": by})

    def kill_marked(self, run_id: str, *, persistent: bool = True, budget: float = ABORT_PERSISTENCE) -> list[int]:
        """Kill every process of the run that is left; the pids that survived SIGKILL. `persistent` keeps
        trying through a dropped connection (for `budget` seconds)."""
        cmd, timeout = commands.kill_marked(run_id), max(self.timeout, 30.0)
        result = (self._persistently(cmd, timeout=timeout, budget=budget) if persistent
                  else self._run(cmd, timeout=timeout))
        return marks.parse_kill_marked(result.out)

    def warmup(self, run_id: str, gpu: int, command: str) -> WarmupChannel:
        """One GPU's warmup (warmup.sh), running."""
        return WarmupChannel(self._open(commands.warmup(run_id, gpu, command)))

    def gpu_memory(self, gpu: int) -> MemoryReading:
        """A GPU's memory used, as nvidia-smi reads it now."""
        result = self._run(commands.gpu_memory((gpu,)))
        if result.exit_code != 0:
            if "not found" in result.err or result.exit_code == 127:
                return MemoryReading(absent=True)  # no nvidia-smi on this target (the local demo)
            return MemoryReading(error=result.err.strip())
        try:
            return MemoryReading(parse_sample(result.out).get(gpu, (None, None))[0])
        except SmiError as exc:
            return MemoryReading(error=str(exc))

    def follow(self, run_id: str, session: str, offset: int, inode: int, tail: int, once: bool,
               events_offset: int) -> FollowChannel:
        """The follower (framed log bytes and watchdog events from these offsets), running."""
        return FollowChannel(self._open(commands.follow(run_id, session, offset, inode, tail, once, events_offset)))

    def runs(self, limit: int, playbook: str | None = None, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """The run history, newest first: `limit` runs (of `playbook`, filtered there before the limit);
        GpuopsError when it cannot be read."""
        result = self._run(commands.runs(limit, playbook), timeout=timeout)
        if result.exit_code != 0:
            raise GpuopsError(f"{self.label}: could not read the run history (exit {result.exit_code}): "
                              f"{result.err.strip()[-300:]}")
        return read_runs(result.out)

    def metrics(self, playbook: str | None = None) -> list[dict[str, Any]]:
        """Each run that goes on, or ended within its keep_ended, as the metrics tool reads it now (a snapshot
        that agent/wire/metric_table.py renders); GpuopsError when the target cannot say."""
        result = self._run(commands.metrics(playbook), timeout=max(self.timeout, 30.0))
        if result.exit_code != 0:
            raise GpuopsError(f"{self.label}: could not read the runs' metrics (exit {result.exit_code}): "
                              f"{self._said(result.err.strip()[-300:])}")
        return read_runs(result.out)

    def stacks(self, run_id: str, *, recorded: bool) -> list[dict[str, Any]]:
        """One {pid, file, threads, via, text[, attempt, error]} per Python process of the run: taken now (the
        run goes on) or as recorded before an abort; text masked. GpuopsError when the target cannot say."""
        result = self._run(commands.stacks(run_id, recorded), timeout=max(self.timeout, 30.0))
        if result.exit_code != 0:
            raise GpuopsError(f"{self.label}: could not read the stacks of run {run_id} (exit {result.exit_code}): "
                              f"{self._said(result.err.strip()[-300:])}")
        return [{**row, "text": self._said(str(row.get("text") or ""))} for row in marks.parse_stacks(result.out)]

    def report(self, run_id: str | None, session: str) -> dict[str, Any]:
        """One run's records, samples, events and stacks for its report (run_id None: the session's current
        run); NoRun (exit 2, naming the newest runs) when there is no such run."""
        result = self._run(commands.report(run_id, session), timeout=max(self.timeout, 30.0))
        reply = read_report(result.out)
        if result.exit_code != 0 or reply is None:
            raise GpuopsError(f"{self.label}: could not read the run's records (exit {result.exit_code}): "
                              f"{self._said(result.err.strip())[-300:]}")
        if reply.get("error") == "no-run":
            known = ", ".join(reply.get("known") or []) or "none"
            what = f"no run {run_id}" if run_id else f"no run of session '{session}'"
            err = NoRun(f"{self.label}: {what} in ~/.gpuops/runs (its newest runs: {known})",
                        hint=f"`gpuops runs -t {self.label}` lists every run of the target")
            err.target = self.label
            raise err
        return reply

    def notify_test(self, spec: bytes, *, timeout: float) -> list[dict[str, Any]]:
        """What each notify channel answered to one test payload (the spec on stdin, one line, secrets
        included). Its stdin is held open while it works: its end (gpuops killed or gone) ends the agent
        and its commands there. RemoteError when the tool said nothing."""
        stream = self._open(commands.notify_test())
        out, code = b"", None
        deadline = time.monotonic() + max(self.timeout, timeout)
        try:
            stream.write(spec.rstrip(b"\n") + b"\n")
            while time.monotonic() < deadline:
                chunk = stream.read(min(1.0, deadline - time.monotonic()))
                if chunk == b"":
                    break
                out += chunk or b""
            code = stream.wait(5.0)
        finally:
            stream.close()
        text = out.decode("utf-8", "replace")
        answers = marks.parse_notify_test(text)
        if not answers:
            if self.transport.container is not None:
                self.transport.container.raise_for_container(text)
            said = "no answer within %gs" % (max(self.timeout, timeout)) if code is None else f"exit {code}"
            raise RemoteError(self._said(f"{self.label}: notify-test failed ({said}): "
                                         f"{text.strip()[-300:] or 'nothing said'}"))
        return answers

    def kill_session(self, session: str) -> None:
        """End a tmux session that has no run record."""
        self._run(commands.kill_session(session))

    # -- the connection -----------------------------------------------------------------------------------
    def container_state(self) -> str | None:
        """A container's state (`running`, `stopped`, `missing` ...); None on a host."""
        container = self.transport.container
        return None if container is None else container.container_state(timeout=30.0)

    def reconnect(self) -> None:
        self.transport.reconnect()
