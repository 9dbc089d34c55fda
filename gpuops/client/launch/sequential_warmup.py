"""Warmup: one GPU after another; the next starts only when the last exited 0 and its memory drained."""

from __future__ import annotations

import re
import time
from typing import Iterator

from gpuops.agent.wire import protocol as p
from gpuops.client.events import Event
from gpuops.client.launch.uninterruptible import shielded
from gpuops.client.outcome import run_info
from gpuops.client.play import Play
from gpuops.client.runspec import meta
from gpuops.errors import ConnectError, GpuopsError, RunStopped, WarmupFailed

TAIL_LINES = 30
#: Seconds an interrupted launch keeps trying to stop its warmup through a broken connection.
STOP_BUDGET = 30.0


class WarmupConnectionLost(ConnectError):
    """The connection dropped during a warmup: the warmup was stopped, training not started."""


def render_warmup_command(template: str, gpu: int) -> str:
    """Replace {gpu} in one left-to-right pass; {{ and }} are literal braces."""
    return re.sub(r"\{\{|\}\}|\{gpu\}", lambda m: {"{{": "{", "}}": "}"}.get(m.group(0), str(gpu)), template)


class WarmupError(WarmupFailed):
    """A GPU's warmup failed; carries the output tail."""

    def __init__(self, message: str, gpu: int, tail: list[str]) -> None:
        super().__init__(message, hint="fix the warmup command (it runs before training; training was not started)")
        self.gpu = gpu
        self.tail = tail
        self.timed_out_by_deadline = False


def run_warmups(play: Play, run_id: str, *, deadline: float | None = None) -> Iterator[Event]:
    """Yield warmup events; raise WarmupError on a failure (after killing the warmup's processes)."""
    warmup = play.playbook.warmup
    if warmup is None:
        return
    durations: dict[int, float] = {}
    for gpu in warmup.gpus:
        started = time.monotonic()
        yield Event("warmup_start", play.target.name, run_id, {"gpu": gpu})
        tail: list[str] = []
        budget = warmup.timeout if deadline is None else min(warmup.timeout, max(0.0, deadline - started))
        try:
            yield from _run_one(play, run_id, gpu, budget, tail)
        except WarmupError as exc:
            exc.timed_out_by_deadline = budget < warmup.timeout and "timed out" in str(exc)
            raise
        yield from _drain(play, run_id, gpu, warmup.drain_timeout, tail)
        durations[gpu] = round(time.monotonic() - started, 3)
        yield Event("warmup_done", play.target.name, run_id, {"gpu": gpu, "seconds": durations[gpu]})


def _run_one(play: Play, run_id: str, gpu: int, timeout: float, tail: list[str]) -> Iterator[Event]:
    assert play.playbook.warmup is not None
    warmup = play.door.warmup(run_id, gpu, render_warmup_command(play.playbook.warmup.command, gpu))
    deadline = time.monotonic() + timeout
    code: int | None = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            lines = warmup.lines(min(left, 1.0))
            if warmup.ended:
                code = warmup.wait(min(max(left, 0.1), 30.0))
                break
            for raw in lines or ():
                line = play.mask(raw)
                tail.append(line)
                del tail[:-TAIL_LINES]
                yield Event("warmup_output", play.target.name, run_id, {"gpu": gpu, "line": line})
        rest = warmup.rest()
        if rest:
            tail.append(play.mask(rest))
        lost = code is not None and code < 0 and warmup.connection_lost()
    finally:
        warmup.close()
    if code == 0:
        return
    if lost:
        # Not the warmup's failure: the link dropped. Stop the warmup there (through a new connection).
        play.door.kill_marked(run_id)
        raise WarmupConnectionLost(
            play.target.name, f"the connection was lost during the warmup on GPU {gpu}; the warmup was stopped and "
            "training was not started", hint="check the network to the host, then launch again")
    _kill(play, run_id, gpu)
    if _stopped(play, run_id):
        raise RunStopped(f"{play.target.name}: the launch was stopped by `gpuops stop` during the warmup on GPU {gpu}; training not started")
    if code is None:
        raise WarmupError(f"{play.target.name}: warmup on GPU {gpu} timed out after {timeout:g}s", gpu, tail)
    raise WarmupError(f"{play.target.name}: warmup on GPU {gpu} exited with code {code}", gpu, tail)


def _stopped(play: Play, run_id: str) -> bool:
    """`gpuops stop` ended the launch: the abort record it claimed is there. Never read from the warmup's
    exit status or output: a warmup may exit 86 (p.STOPPED_EXIT) or print the `stopped` mark itself."""
    info = run_info(play, run_id)
    return info is not None and info.abort is not None


def stop_warmup(play: Play, run_id: str, durations: dict[str, float]) -> None:
    """Ctrl-C during the warmup: end it there (through a new connection if the interrupted one broke;
    a second Ctrl-C waits until it is done), and record the launch as interrupted (best effort)."""
    with shielded():
        try:
            play.door.kill_marked(run_id, budget=STOP_BUDGET)
        except GpuopsError:
            pass  # the target is gone: nothing of the warmup is left to stop there
        try:
            play.door.record(run_id, p.META, meta(play, run_id, "interrupted", warmup_seconds=durations))
        except GpuopsError:
            pass


def _kill(play: Play, run_id: str, gpu: int) -> None:
    """Kill the warmup's whole process tree, found by the run's marker.

    GPUOPS_PHASE=warmup-N names no run: another launch warming the same GPU index on this
    target (another session) would be killed too. During warmup only warmup processes carry
    the run's id, so the run marker finds exactly this warmup (and children it detached).
    """
    play.door.kill_marked(run_id, persistent=False)


def _drain(play: Play, run_id: str, gpu: int, drain_timeout: float, tail: list[str]) -> Iterator[Event]:
    """Wait until the GPU's memory is back under the preflight threshold."""
    limit = play.playbook.preflight.max_memory_used_mib
    deadline = time.monotonic() + drain_timeout
    used: int | None = None
    announced = False
    while True:
        memory = play.door.gpu_memory(gpu)
        if memory.absent:
            return  # no nvidia-smi on this target (the local demo): nothing to drain
        if memory.error is not None:
            raise WarmupError(f"{play.target.name}: cannot read GPU {gpu} memory after warmup: {memory.error}", gpu, tail)
        used = memory.used_mib
        if used is None or used <= limit:
            return
        if time.monotonic() >= deadline:
            _kill(play, run_id, gpu)
            raise WarmupError(
                f"{play.target.name}: GPU {gpu} memory did not drain after its warmup ({used} MiB > {limit} MiB after {drain_timeout:g}s)",
                gpu,
                tail,
            )
        if not announced:
            announced = True
            yield Event("warmup_draining", play.target.name, run_id, {"gpu": gpu, "memory_used_mib": used})
        time.sleep(0.25)
