"""One round trip that reads everything status and preflight need from a target."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuops.client.gpus import Gpu, SmiError, parse_gpus
from gpuops.client.runs import RunInfo
from gpuops.agent.wire import protocol as p

# The probe itself is the shipped shell tool gpuops/agent/sh/probe.sh (gpuops.client.tools.probe).


@dataclass
class SessionState:
    session: str
    alive: bool = False
    locked_by: str | None = None
    run: RunInfo | None = None


@dataclass
class Probe:
    now: float | None = None
    smi: str = "ok"  # ok | absent | error
    smi_error: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    tmux: bool = True
    python: tuple[int, ...] | None = None  # the target's python3 version; None when it has none
    sessions: dict[str, SessionState] = field(default_factory=dict)


def parse_probe(text: str) -> Probe:
    """probe.sh's reply (read by the protocol's one parser) as status and preflight use it."""
    reply = p.parse_probe(text)
    probe = Probe(now=reply.now, smi="ok" if reply.smi else "absent", tmux=reply.tmux, python=reply.python)
    if reply.smi:
        if reply.gpus_rc != 0 or reply.apps_rc != 0:
            probe.smi = "error"
            failed = reply.gpus_text if reply.gpus_rc != 0 else reply.apps_text  # a missing driver fails both alike
            probe.smi_error = " ".join(failed.split())[:300] or "nvidia-smi failed"
        else:
            try:
                probe.gpus = parse_gpus(reply.gpus_text, reply.apps_text)
            except SmiError as exc:
                probe.smi, probe.smi_error = "error", str(exc)
    for name, said in reply.sessions.items():
        state = probe.sessions[name] = SessionState(name, alive=said.alive, locked_by=said.locked_by)
        if said.run is not None:
            r = said.run
            state.run = RunInfo(
                run_id=r.run_id, session=name, meta=r.meta, exit_code=r.exit_code, abort=r.abort,
                log_size=r.log_size, log_mtime=r.log_mtime, session_alive=said.alive, remote_now=reply.now,
                abort_done=r.abort_done, watchdog=r.watchdog, watchdog_running=r.watchdog_running,
                samples_text=r.samples_text, guard_counts=r.guard_counts, started=r.started,
            )
            state.run.meta["launcher_alive"] = said.locked_by is not None
    return probe
