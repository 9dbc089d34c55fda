"""What the agent's tools answer, as the client uses it: each built from agent/wire's one parser of that
tool's output (markers, frames, JSON lines), never from the raw text anywhere else."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Union

from gpuops.agent.wire import protocol as p
from gpuops.client.gpus import Gpu, SmiError, parse_gpus
from gpuops.client.runs import RunInfo


# -- probe ---------------------------------------------------------------------------------------------
@dataclass
class SessionState:
    session: str
    alive: bool = False
    locked_by: str | None = None
    run: RunInfo | None = None


@dataclass
class Probe:
    """The target's clock, GPUs, tools and each session's run, in one reply (probe.sh's)."""

    now: float | None = None
    smi: str = "ok"  # ok | absent | error
    smi_error: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    tmux: bool = True
    python: tuple[int, ...] | None = None  # the target's python3 version; None when it has none
    sessions: dict[str, SessionState] = field(default_factory=dict)


def read_probe(text: str) -> Probe:
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


# -- lock ----------------------------------------------------------------------------------------------
@dataclass
class Locked:
    """lock.sh's answer: the lock's verdict (p.LockReply) and the probe taken under it (None: refused)."""

    said: p.LockReply
    probe: Probe | None


# -- abort ---------------------------------------------------------------------------------------------
@dataclass
class AbortResult:
    record: dict[str, Any]  # the record in force: ours, or the one who stopped the run first
    won: bool = True  # False: someone else had already claimed the abort
    survivors: list[int] = field(default_factory=list)
    held_by: dict[str, list[int]] = field(default_factory=dict)  # GPU -> pids, for a GPU that did not drain
    gpus: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    session_gone_at: float | None = None  # the target's clock

    @property
    def by(self) -> str | None:
        return self.record.get("by")


def read_abort(text: str, record: dict[str, Any]) -> AbortResult:
    """The abort tool's reply: who won the claim and what was left once it finished."""
    out = AbortResult(record)
    said = p.parse_abort(text)
    if said.already is not None:
        out.won = False
        out.record = said.already
    if said.done is not None:
        done = said.done
        out.survivors = [int(x) for x in done.get("survivors") or [] if isinstance(x, int)]
        out.gpus = list(done.get("gpus") or [])
        out.held_by = {str(g): [int(x) for x in pids if isinstance(x, int)]
                       for g, pids in (done.get("held_by") or {}).items() if isinstance(pids, list)}
        out.seconds = float(done.get("seconds") or 0.0)
        out.session_gone_at = done.get("session_gone_at")
    return out


# -- runs ----------------------------------------------------------------------------------------------
def read_runs(text: str) -> list[dict[str, Any]]:
    """The `runs` tool's JSON lines: one record per run (lines that are not one are noise of the shell)."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("run"):
            rows.append(row)
    return rows


def read_report(text: str) -> dict[str, Any] | None:
    """The `report` tool's one JSON object (its last line that is one: what comes before is noise of the shell)."""
    for line in reversed(text.splitlines()):
        try:
            reply = json.loads(line)
        except ValueError:
            continue
        if isinstance(reply, dict):
            return reply
    return None


# -- follow --------------------------------------------------------------------------------------------
@dataclass
class Data:
    inode: int
    offset: int
    data: bytes


@dataclass
class Heartbeat:
    now: float
    size: int
    mtime: float
    watchdog_age: float = -1.0  # seconds since the watchdog's heartbeat; -1: it never wrote one
    watchdog_offset: int = -1  # the log offset it has matched up to
    watchdog_state: str = "-"  # watching | aborting | done


@dataclass
class WatchdogEvent:
    """One line of the watchdog's events.jsonl (a match, an abort, a restart ...) and where it ends."""

    offset: int
    record: dict
    end: int


@dataclass
class Ended:
    how: str  # exit | abort | gone | once | container-stopped | container-missing
    code: int | None


@dataclass
class Reset:
    """The log was truncated or replaced: what follows starts at offset 0 of the new file."""

    why: str


Frame = Union[Data, Heartbeat, WatchdogEvent, Ended, Reset]


class FollowReader:
    """The follower's frames (protocol.FrameReader) as typed replies."""

    def __init__(self) -> None:
        self.reader = p.FrameReader()

    @property
    def noise(self) -> str:
        """What came that was no frame (a shell's complaint), for an error message."""
        return " | ".join(self.reader.noise)[-300:]

    def feed(self, chunk: bytes) -> Iterator[Frame]:
        for kind, fields in self.reader.feed(chunk):
            if kind == p.FRAME_DATA:
                yield Data(*fields)
            elif kind == p.FRAME_EVENTS:
                offset, data = fields
                for line in data.splitlines(keepends=True):
                    try:
                        record = json.loads(line)
                    except ValueError:
                        record = None
                    if isinstance(record, dict):
                        yield WatchdogEvent(offset, record, offset + len(line))
                    offset += len(line)
            elif kind == p.FRAME_HEARTBEAT:
                yield Heartbeat(*fields)
            elif kind == p.FRAME_END:
                yield Ended(*fields)
            elif kind == p.FRAME_TRUNCATED:
                yield Reset("truncated")
            elif kind == p.FRAME_ROTATED:
                yield Reset("rotated")


# -- warmup --------------------------------------------------------------------------------------------
@dataclass
class GpuMemory:
    """One GPU's memory as nvidia-smi reads it after a warmup: `absent` when the target has no nvidia-smi."""

    used_mib: int | None = None
    absent: bool = False
    error: str | None = None
