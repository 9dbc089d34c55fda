"""launch = preflight -> warmup -> start (watchdog, then training) -> follow; `plan` shows the same
steps without running them; `stop` ends a run (or a launch still warming up) from anywhere."""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

from gpuops.agent.wire import protocol as p
from gpuops.client.door import commands
from gpuops.client.door.commands import dumps
from gpuops.client.events import Event, Outcome
from gpuops.client.gpu_health import XidsSoon, host_door, meta_state, start_host_watch
from gpuops.client.launch.preflight import LaunchLock, evaluate, wants_health, xid_window
from gpuops.client.launch.run_id import new_run_id
from gpuops.client.launch.sequential_warmup import WarmupError, render_warmup_command, run_warmups, stop_warmup
from gpuops.client.launch.uninterruptible import shielded
from gpuops.client.play import Play
from gpuops.client.runspec import meta, prepare_spec
from gpuops.client.stop_call import abort_run
from gpuops.client.view.viewer import view
from gpuops.command import Cmd
from gpuops.errors import ConnectError, ExitCode, GpuopsError, RunStopped


def launch(play: Play, *, detach: bool = False, timeout: float | None = None) -> Iterator[Event | Outcome]:
    """Run the whole flow; the last item is the Outcome."""
    began = time.monotonic()
    deadline = began + timeout if timeout else None
    target = play.target.name
    lock = LaunchLock(play)
    xids = XidsSoon(play, xid_window(play))  # the host's kernel log, read beside the lock's round trip
    probe = lock.acquire()
    run_id: str | None = None
    started = False
    try:
        if lock.stale_holder:
            yield Event("lock_recovered", target, None, {"holder": lock.stale_holder})
        health = yield from evaluate(play, probe, xids.result())
        run_id = new_run_id()
        _prepare(play, run_id)
        yield Event("run_created", target, run_id, {"session": play.session})
        durations: dict[str, float] = {}
        try:
            for ev in run_warmups(play, run_id, deadline=deadline):
                if ev.kind == "warmup_done":
                    durations[str(ev.get("gpu"))] = ev.get("seconds")
                yield ev
        except (KeyboardInterrupt, GeneratorExit):
            stop_warmup(play, run_id, durations)
            raise
        except WarmupError as exc:
            _record(play, run_id, "warmup-failed", error=play.mask(str(exc)), warmup_seconds=durations)
            if exc.timed_out_by_deadline:
                yield Outcome("timeout", ExitCode.TIMEOUT, f"--timeout ran out during warmup on GPU {exc.gpu}; training not started", {"run": run_id})
                return
            raise
        _start(play, run_id, durations, host_kernel_log=meta_state(play, health))
        started = True
        yield Event("started", target, run_id, {"session": play.session, "log": f"~/.gpuops/runs/{run_id}/log",
                                                "warmup_seconds": durations, "watchdog": True})
        yield from start_host_watch(play, run_id, health, began)
    except RunStopped as exc:
        yield Outcome("stopped", exc.exit_code, str(exc), {"run": run_id})
        return
    except GpuopsError as exc:
        if run_id is not None and not started and not isinstance(exc, WarmupError):
            # Leave no half-made run: the record says it never started, and why.
            phase = "connection-lost" if isinstance(exc, ConnectError) else "start-failed"
            _record(play, run_id, phase, error=play.mask(str(exc)), quiet=True)
        raise
    finally:
        with shielded():  # a second Ctrl-C leaves no lock holder behind
            lock.release()
    if detach:
        yield Outcome("started", ExitCode.OK, f"run {run_id} started in tmux session '{play.session}' on {target}; "
                      "its watchdog stops it on a fatal signature or a stall", {"run": run_id, "attempts": 1})
        return
    yield from view(play, run_id, deadline=deadline)


def _prepare(play: Play, run_id: str) -> None:
    """The run directory, from one JSON document on stdin (env values of any size)."""
    play.door.prepare(run_id, prepare_spec(play, run_id))


def _record(play: Play, run_id: str, phase: str, *, quiet: bool = False, **extra: Any) -> None:
    """Rewrite meta.json with the launch's phase (best effort when the launch is failing anyway)."""
    try:
        play.door.record(run_id, p.META, meta(play, run_id, phase, **extra))
    except GpuopsError:
        if not quiet:
            raise


def _start(play: Play, run_id: str, durations: dict[str, float], **extra: Any) -> None:
    """meta.json says running; the watchdog starts and answers; then training starts in tmux."""
    _record(play, run_id, "running", warmup_seconds=durations, **extra)
    play.door.start(run_id, play.session)


def plan(play: Play) -> list[tuple[str, str, str | None]]:
    """Every command a launch would send, rendered exactly (secrets masked), with what goes on its stdin:
    (step, command, stdin or None)."""
    from gpuops.client.door.bundle import bundle, install_command

    rid = "00000000-000000-000000"

    def show(cmd: Cmd) -> str:
        return play.transport.wrap(cmd).render(display=True, mask=play.mask)

    def shown(data: bytes) -> str:
        return play.mask(data.decode())

    b = bundle()
    running = dumps(meta(play, rid, "running", warmup_seconds={})).encode()
    record = json.dumps({"reason": "match", "rule": "<rule>", "line": "<matched line>", "excerpt": "<excerpt>"}).encode()
    steps: list[tuple[str, str, str | None]] = [
        ("copy gpuops' target files, only when the target lacks them", show(install_command()),
         f"<a {len(b.zip)}-byte zip of gpuops/agent (digest {b.digest})>"),
        ("preflight (lock + probe, one round trip)", show(commands.lock(play.session, "<user@machine pid N>", play.run_gpus,
                                                                         health=wants_health(play))),
         "<a heartbeat line every 5 s, then `release`>"),
    ]
    window = xid_window(play)
    host = host_door(play).transport
    if window is not None:
        steps.append(("beside it, on the host: the Xids of its kernel log's last seconds",
                      host.wrap(commands.xids(window)).render(display=True, mask=play.mask), None))
    steps += [
        ("create the run directory", show(commands.prepare(rid)), prepare_spec(play, rid, shown=True).decode()),
    ]
    if play.playbook.warmup:
        for gpu in play.playbook.warmup.gpus:
            cmd = commands.warmup(rid, gpu, render_warmup_command(play.playbook.warmup.command, gpu))
            steps.append((f"warmup GPU {gpu}", show(cmd), None))
            steps.append((f"after warmup GPU {gpu}: poll its memory until it drains", show(commands.gpu_memory((gpu,))), None))
    steps += [
        ("record the phase", show(commands.record(rid, p.META)), shown(running)),
        ("start the watchdog, then training in tmux", show(commands.start(rid)), None),
    ]
    if play.playbook.watch.host_kernel_log != "off" and play.run_gpus:
        link = commands.host_link(rid)
        container = play.transport.container
        steps.append(("on the host, where it can read its kernel log: follow it for the run's GPUs (the spec on stdin; "
                      "it reaches the run through the command in `link`)",
                      host.wrap(commands.host_watch()).render(display=True, mask=play.mask),
                      json.dumps({"run": rid, "window": "<seconds since the launch began, + 60>",
                                  "gpus": {"<bus>": {"index": "<GPU>", "bus_id": "<bus id>", "uuid": "<uuid>"}},
                                  "link": (container.from_host(link) if container else link).words()})))
    steps += [
        ("follow the log and the watchdog's events", show(commands.follow(rid, play.session, 0, 0, -1, False, 0)), None),
        ("stop the run: a match or a stall while its watchdog is gone, or --timeout", show(commands.abort(rid, "client")),
         shown(record)),
        ("after a run its watchdog did not see end: reap leftover processes", show(commands.kill_marked(rid)), None),
    ]
    return [(name, text.replace(rid, "<run-id>"), None if data is None else data.replace(rid, "<run-id>"))
            for name, text, data in steps]


def stop(play: Play) -> Iterator[Event | Outcome]:
    """Abort the current run the way a matched signature does; success once no run is alive."""
    from gpuops.client.outcome import run_info, session_state

    state = session_state(play)
    info = state.run if state is not None else None
    if state is not None and info is None and state.alive:
        yield Event("abort_start", play.target.name, None, {"reason": "stop", "by": "stop"})
        play.door.kill_session(play.session)
        yield Outcome("stopped", ExitCode.OK, f"tmux session '{play.session}' killed (no run record)", {})
        return
    state_alive = info is not None and info.alive  # warming and restarting count: a stop ends them for good
    if info is None or not state_alive:
        if info is not None:
            play.door.kill_marked(info.run_id, persistent=False)
        yield Outcome("not-running", ExitCode.OK, f"no run of '{play.session}' is alive on {play.target.name}",
                      {"run": info.run_id if info else None})
        return
    run_id = info.run_id
    warming = info.state is p.RunState.WARMING
    yield Event("abort_start", play.target.name, run_id, {"reason": "stop", "by": "stop",
                                                          **({"phase": info.meta.get("phase")} if warming else {})})
    result = abort_run(play, run_id, "stop", by="stop")
    if not result.won:
        yield Event("stopped_elsewhere", play.target.name, run_id, {"reason": result.record.get("reason"),
                                                                   "stopped_by": result.by, "rule": result.record.get("rule")})
    else:
        yield Event("aborted", play.target.name, run_id, {"reason": "stop", "survivors": result.survivors, "gpus": result.gpus,
                                                         "held_by": result.held_by,
                                                         "seconds": round(result.seconds, 3), "by": "stop"})
    if result.survivors:
        raise GpuopsError(f"{play.target.name}: processes {result.survivors} of run {run_id} survived SIGKILL")
    after = run_info(play, run_id)
    # Between attempts (restarting) a run has no session yet is alive: its watchdog ends it once it sees the stop.
    settle = time.monotonic() + 20.0
    while after is not None and after.state is p.RunState.RESTARTING and time.monotonic() < settle:
        time.sleep(0.3)
        after = run_info(play, run_id)
    if after is not None and (after.session_alive or after.state is p.RunState.RESTARTING):
        why = f"abort record: {json.dumps(after.abort)}" if after.abort else "no abort record could be written"
        raise GpuopsError(f"{play.target.name}: run {run_id} is still alive after its abort ({why})")
    if warming:
        yield Outcome("stopped", ExitCode.OK, f"launch of run {run_id} stopped during its warmup; training will not start", {"run": run_id})
    else:
        attempts = (after or info).attempts
        yield Outcome("stopped", ExitCode.OK, f"run {run_id} stopped" + (f" (attempt {attempts})" if attempts > 1 else ""),
                      {"run": run_id, "attempts": attempts})
