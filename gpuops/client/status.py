"""Status of many targets in parallel: one round trip each, one dead host never hides the others."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from gpuops.agent.wire.marks import ProbeReply
from gpuops.client.door import Door
from gpuops.errors import GpuopsError
from gpuops.targets import Inventory, Target
from gpuops.transport import Pool

MAX_PARALLEL = 8


@dataclass
class TargetStatus:
    target: str
    host: str
    ctid: int | None
    reachable: bool = False
    error: str | None = None
    error_code: int | None = None
    hint: str | None = None
    container: str | None = None
    probe: ProbeReply | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        probe = self.probe
        # The contract's `run` key where a run exists: the newest (run ids start with their start time).
        runs = sorted(s.run.run_id for s in probe.sessions.values() if s.run) if probe else []
        return {
            "target": self.target,
            **({"run": runs[-1]} if runs else {}),
            "host": self.host,
            "ctid": self.ctid,
            "reachable": self.reachable,
            "error": self.error,
            "hint": self.hint,
            "container": self.container,
            "nvidia_smi": probe.smi if probe else None,
            "nvidia_smi_error": probe.smi_error if probe else None,
            "gpus": _gpus_json(probe) if probe else [],
            "sessions": [
                {
                    "session": s.session,
                    "alive": s.alive,
                    "launch_in_progress": s.locked_by,
                    "run": s.run.as_json() if s.run else None,
                }
                for s in (probe.sessions.values() if probe else [])
            ],
        }


#: The memory history `status` shows: the last minutes of the live runs' samples.
HISTORY_SECONDS = 300.0


def memory_history(probe: ProbeReply) -> dict[int, tuple[list[int | None], float]]:
    """Per GPU: its memory over the last minutes from the samples of the live run using it, and the
    swing that run's watchdog counts as volatile."""
    out: dict[int, tuple[list[int | None], float]] = {}
    for s in probe.sessions.values():
        run = s.run
        if run is None or not run.samples_text or not s.alive:
            continue
        from gpuops.agent.wire.detector_list import by_key
        from gpuops.agent.wire.samples import parse_lines  # only where a live run has samples

        samples = parse_lines(run.samples_text)
        if samples:
            recent = [x for x in samples if x.t >= samples[-1].t - HISTORY_SECONDS]
            default = by_key("gpu_memory").key_of("max_swing_mib").default  # an older watchdog's heartbeat lacks it
            swing = float(((run.watchdog or {}).get("telemetry") or {}).get("max_swing_mib") or default)
            for gpu in sorted({g for x in recent for g in x.gpus}):
                out[gpu] = ([x.memory(gpu) for x in recent], swing)
    return out


def _gpus_json(probe: ProbeReply) -> list[dict[str, Any]]:
    """Each GPU, with its memory over the last minutes where a live run samples it."""
    history = memory_history(probe)
    out = []
    for g in probe.gpus:
        row = g.as_json()
        if g.index in history:
            series, swing = history[g.index]
            known = [v for v in series if v is not None]
            row.update(memory_history_mib=series,
                       memory_shape="volatile" if known and max(known) - min(known) > swing else "flat")
        out.append(row)
    return out


def probe_target(pool: Pool, inventory: Inventory, target: Target, sessions: tuple[str, ...] | None) -> TargetStatus:
    """Everything about one target in one round trip (for a container, its state in the same trip)."""
    status = TargetStatus(target.name, target.host, target.ctid)
    started = time.monotonic()
    transport = pool.target(target)
    try:
        status.probe, status.container = Door(transport, label=target.name).probe_with_state(sessions)
        status.reachable = True
    except GpuopsError as exc:
        status.error = str(exc)
        status.error_code = exc.exit_code
        status.hint = exc.hint
    status.seconds = time.monotonic() - started
    return status


def each_status(pool: Pool, inventory: Inventory, targets: list[Target],
                sessions: tuple[str, ...] | None) -> Iterator[TargetStatus]:
    """Every target probed, at most MAX_PARALLEL at a time, each status as soon as it is read: a host that
    never answers holds up only its own (for its connect timeout and retries), not the targets already read.
    The probes run in daemon threads, so Ctrl-C ends the command at once, not after a silent host's timeout
    (a thread pool's workers would be waited for)."""
    if len(targets) == 1:
        yield probe_target(pool, inventory, targets[0], sessions)
        return
    import queue

    done: queue.Queue[TargetStatus | BaseException] = queue.Queue()
    slots = threading.BoundedSemaphore(MAX_PARALLEL)

    def probe(target: Target) -> None:
        with slots:
            try:
                done.put(probe_target(pool, inventory, target, sessions))
            except BaseException as exc:  # a bug: raised where the statuses are read
                done.put(exc)

    for target in targets:
        threading.Thread(target=probe, args=(target,), name=f"gpuops-status-{target.name}", daemon=True).start()
    for _ in targets:
        status = done.get()
        if isinstance(status, BaseException):
            raise status
        yield status


def gather(pool: Pool, inventory: Inventory, targets: list[Target], sessions: tuple[str, ...] | None) -> list[TargetStatus]:
    """Every target's status, in the order asked."""
    order = {t.name: i for i, t in enumerate(targets)}
    return sorted(each_status(pool, inventory, targets, sessions), key=lambda s: order[s.target])
