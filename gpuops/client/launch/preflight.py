"""Preflight: take the target's launch lock and check, in one round trip, that a run may start."""

from __future__ import annotations

import dataclasses
import threading
from typing import Generator, Iterator

from gpuops.agent.wire.health import HealthReading
from gpuops.agent.wire.marks import ProbeReply
from gpuops.agent.wire.verdict import Verdict
from gpuops.client.door.channels import LockChannel
from gpuops.client.events import Event
from gpuops.client.gpu_health import HINT, Health, HostXids, gpu_event, refusal, verdicts
from gpuops.client.launch.gpus import GpuCheck, check_idle
from gpuops.client.play import Play, holder_id
from gpuops.errors import PreflightFailed, RunAlive, TargetNotReady

#: The oldest Python the target package runs on (tests/agent/test_agent_package.py proves it).
OLDEST_PYTHON = (3, 8)


class PreflightProblem(PreflightFailed):
    """Preflight found the target not ready; carries what was measured."""

    def __init__(self, message: str, findings: list[GpuCheck], play: Play, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.findings = findings
        self.thresholds = {
            "max_memory_used_mib": play.playbook.preflight.max_memory_used_mib,
            "max_utilization_pct": play.playbook.preflight.max_utilization_pct,
            "allow_processes": play.playbook.preflight.allow_processes,
        }


class LaunchLock:
    """The target-side lock of one session: held while the launcher's heartbeats keep coming."""

    def __init__(self, play: Play) -> None:
        self.play = play
        self._channel: LockChannel | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stale_holder: str | None = None
        self.holder: str | None = None

    def acquire(self) -> ProbeReply:
        """Take the locks (the session's and its GPUs') and return the probe taken under them;
        raise RunAlive when another launch or run holds one."""
        play = self.play
        self.holder = holder_id()
        self._channel = play.door.lock(play.session, self.holder, play.run_gpus, health=wants_health(play))
        said = self._channel.wait_locked(play.timeout)
        if said.busy is not None:
            self.release()
            raise RunAlive(
                f"{play.target.name}: a launch of '{play.session}' is already in progress ({said.busy or 'another gpuops process'})",
                hint="wait for it, or see `gpuops status`",
            )
        if said.gpu_held is not None:
            self.release()
            gpu, holder = said.gpu_held
            raise RunAlive(
                f"{play.target.name}: GPU {gpu} belongs to another {holder}",
                hint="a GPU is used by one launch or run at a time on a target; see `gpuops status`",
            )
        assert said.probe is not None
        self.stale_holder = said.stale
        self._thread = threading.Thread(target=self._beat, daemon=True, name="gpuops-lock-heartbeat")
        self._thread.start()
        return said.probe

    def _beat(self) -> None:
        while not self._stop.wait(5.0):
            try:
                if self._channel is not None:
                    self._channel.beat()
            except Exception:  # a broken stream ends the lock on the target: nothing to do here
                return

    def release(self) -> None:
        self._stop.set()
        if self._channel is not None:
            lost = self._channel.release()
            self._channel = None
            if lost and self.holder:
                self._forget(self.holder)

    def _forget(self, holder: str) -> None:
        """The lock holder there ended with our connection: take our name off its files, so the next
        launch does not report a launcher that died (best effort, through a new connection)."""
        try:
            self.play.door.forget_lock(self.play.session, holder, self.play.run_gpus)
        except Exception:  # the host is gone too: the next launch says it recovered the lock
            pass


def wants_health(play: Play) -> bool:
    """The probe under the lock reads the GPUs' health: preflight judges it, or the host's follower needs the
    GPUs' bus ids (watch.host_kernel_log)."""
    pb = play.playbook
    return bool(play.run_gpus) and (pb.preflight.health != "off" or pb.watch.host_kernel_log != "off")


def xid_window(play: Play) -> float | None:
    """Seconds of the host's kernel log preflight reads (None: none): the playbook's window, or a minute only to
    learn whether the host lets its follower read it."""
    pb = play.playbook
    if not play.run_gpus:
        return None
    if pb.preflight.health != "off" and pb.preflight.xid_window > 0:
        return pb.preflight.xid_window
    return 60.0 if pb.watch.host_kernel_log != "off" else None


def evaluate(play: Play, probe: ProbeReply, xids: HostXids | None = None) -> Generator[Event, None, Health | None]:
    """Check the probe against the playbook; raise PreflightProblem, else yield the findings. Returns the GPUs'
    health (None where it was not read): the launch hands the GPUs' bus ids to the host's follower."""
    pf = play.playbook.preflight
    state = probe.sessions.get(play.session)
    if state is not None and state.alive:
        run = state.run.run_id if state.run else "unknown run"
        raise RunAlive(
            f"{play.target.name}: tmux session '{play.session}' is alive ({run})",
            hint="see `gpuops status`; stop it with `gpuops stop` or reattach with `gpuops logs -f`",
        )
    ready(play, probe)
    health = None
    if probe.health_fields and probe.smi != "absent":
        health = verdicts(probe.health or HealthReading(), xids or HostXids(error="the host's kernel log was not read"))
        health.refused = list(probe.health_refused)
        if pf.health != "off":
            yield from judge_health(play, health)
    findings: list[GpuCheck] = []
    if pf.gpus:
        if probe.smi != "ok":
            why = "nvidia-smi is not installed" if probe.smi == "absent" else f"nvidia-smi failed: {probe.smi_error}"
            raise PreflightProblem(f"{play.target.name}: cannot check GPUs {list(pf.gpus)}: {why}", [], play)
        findings = check_idle(
            probe.gpus,
            pf.gpus,
            max_memory_mib=pf.max_memory_used_mib,
            max_util_pct=pf.max_utilization_pct,
            allow_processes=pf.allow_processes,
        )
        bad = [f for f in findings if not f.ok]
        if bad:
            raise PreflightProblem(
                f"{play.target.name}: GPU(s) {', '.join(str(f.index) for f in bad)} not idle",
                findings,
                play,
                hint="wait for the other job to finish, or adjust preflight thresholds in the playbook",
            )
    if health is not None:  # each idle GPU with its verdict: where its health was judged (docs/json.md gpu_finding)
        findings = [with_verdict(f, health.verdicts.get(f.index)) for f in findings]
    yield Event(
        "preflight_ok",
        play.target.name,
        data={"gpus": [f.__dict__ for f in findings], "smi": probe.smi,
              **({} if health is None else {"host_kernel_log": {"reader": health.xids.reply.reader if
                                                                health.xids.reply and health.xids.readable else None,
                                                                "why": None if health.xids.readable else health.xids.why}})},
    )
    return health


def judge_health(play: Play, health: Health) -> Iterator[Event]:
    """Refuse (preflight.health: strict) a playbook GPU that needs a reset or service, naming it, the counter and
    NVIDIA's action; warn on what only slows it (and, with warn, on what would have refused it)."""
    strict = play.playbook.preflight.health == "strict"
    bad = health.blocking(play.run_gpus)
    if bad and strict:
        checks = [GpuCheck(v.index if v.index is not None else -1, None, None, 0,
                           tuple(f"{p.counter} = {p.value}: {p.message}" for p in v.blocking), v.bus_id, v.uuid,
                           v.level, tuple(p.as_json() for p in v.problems)) for v in bad]
        raise PreflightProblem(refusal(play, bad), checks, play, hint=HINT)
    for g in play.run_gpus:
        v = health.verdicts.get(g)
        if v is not None and (v.warnings or (v.blocking and not strict)):
            yield gpu_event(play, v, blocking_too=not strict)


def with_verdict(check: GpuCheck, v: Verdict | None) -> GpuCheck:
    """The GPU's check with its health verdict beside it (unchanged where its health was not read)."""
    if v is None:
        return check
    return dataclasses.replace(check, bus_id=v.bus_id, uuid=v.uuid, verdict=v.level,
                               health=tuple(p.as_json() for p in v.problems))


def ready(play: Play, probe: ProbeReply) -> None:
    """The tools a run needs beside it on the target: tmux runs it, python3 runs its watchdog."""
    name = play.target.name
    if not probe.tmux:
        raise TargetNotReady(f"{name}: tmux is not installed on the target (the run lives in a tmux session)",
                             hint="install tmux there (apt-get install tmux)")
    if probe.python is None:
        raise TargetNotReady(f"{name}: python3 is not installed on the target (gpuops' watchdog runs beside the run)",
                             hint="install python3 there (apt-get install python3)")
    if probe.python < OLDEST_PYTHON:
        raise TargetNotReady(
            f"{name}: the target's python3 is {'.'.join(map(str, probe.python))}; gpuops' watchdog needs "
            f"{'.'.join(map(str, OLDEST_PYTHON))} or newer", hint="install a newer python3 on the target")
