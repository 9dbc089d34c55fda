"""launch = preflight -> warmup -> start -> watch; `plan` shows the same steps without running them."""

from __future__ import annotations

import time
from typing import Any, Iterator

from gpuops.command import Cmd, bash
from gpuops.errors import ExitCode, GpuopsError, RemoteError, RunAlive, RunStopped
from gpuops.flow.abort import reap
from gpuops.flow.events import Event, Outcome
from gpuops.flow.job import Job, holder_id
from gpuops.flow.preflight import LaunchLock, evaluate
from gpuops.flow.scripts import (
    MARK, abort_script, gpu_memory_script, kill_marked_script, lock_script, prepare_script, run_sh, start_script,
    warmup_script, write_record,
)
from gpuops.flow.warmup import WarmupError, run_warmups
from gpuops.flow.watch import watch
from gpuops.follow import follower_command
from gpuops.probe import probe_script
from gpuops.runs import dumps, new_run_id


def _meta(job: Job, run_id: str, phase: str, **extra: Any) -> str:
    pb = job.playbook
    return dumps({
        "id": run_id,
        "playbook": pb.name,
        "playbook_path": pb.path,
        "session": job.session,
        "target": job.target.name,
        "ctid": job.target.ctid,
        "command": job.mask(pb.launch.command),
        "workdir": pb.workdir,
        "env": {v.name: ("***" if v.secret else v.value) for v in pb.env},
        "gpus": list(job.run_gpus),
        "phase": phase,
        "launched_by": holder_id(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    })


def launch(job: Job, *, detach: bool = False, timeout: float | None = None) -> Iterator[Event | Outcome]:
    """Run the whole flow; the last item is the Outcome."""
    deadline = time.monotonic() + timeout if timeout else None
    target = job.target.name
    lock = LaunchLock(job)
    probe = lock.acquire()
    run_id: str | None = None
    try:
        if lock.stale_holder:
            yield Event("lock_recovered", target, None, {"holder": lock.stale_holder})
        yield from evaluate(job, probe)
        run_id = new_run_id()
        _check(job, job.run(bash(prepare_script(run_id, job.session, _meta(job, run_id, "warmup")))), "create the run directory")
        yield Event("run_created", target, run_id, {"session": job.session})
        durations: dict[str, float] = {}
        try:
            for ev in run_warmups(job, run_id, deadline=deadline):
                if ev.kind == "warmup_done":
                    durations[str(ev.get("gpu"))] = ev.get("seconds")
                yield ev
        except (KeyboardInterrupt, GeneratorExit):
            reap(job, run_id, persistent=False)  # Ctrl-C: do not wait out a dead link
            job.run(bash(write_record(run_id, "meta.json", _meta(job, run_id, "interrupted", warmup_seconds=durations))))
            raise
        except WarmupError as exc:
            job.run(bash(write_record(run_id, "meta.json", _meta(job, run_id, "warmup-failed", error=job.mask(str(exc)), warmup_seconds=durations))))
            if getattr(exc, "timed_out_by_deadline", False):
                yield Outcome("timeout", ExitCode.TIMEOUT, f"--timeout ran out during warmup on GPU {exc.gpu}; training not started", {"run": run_id})
                return
            raise
        meta = _meta(job, run_id, "running", warmup_seconds=durations)
        result = job.run(bash(start_script(job.playbook, run_id, meta, run_sh(job.playbook, run_id, local=job.local))))
        if MARK + "stopped" in result.out:
            raise RunStopped(f"{target}: the launch was stopped by `gpuops stop` before training started")
        if MARK + "session-exists" in result.out:
            raise RunAlive(f"{target}: tmux session '{job.session}' appeared during the launch", hint="see `gpuops status`")
        if MARK + "started" not in result.out:
            _check(job, result, "start the tmux session")
            raise RemoteError(f"{target}: the tmux session '{job.session}' did not start: {job.mask(result.err.strip())[-400:]}")
        yield Event("started", target, run_id, {"session": job.session, "log": f"~/.gpuops/runs/{run_id}/log", "warmup_seconds": durations})
    except RunStopped as exc:
        yield Outcome("stopped", exc.exit_code, str(exc), {"run": run_id})
        return
    finally:
        lock.release()
    if detach:
        yield Outcome("started", ExitCode.OK, f"run {run_id} started in tmux session '{job.session}' on {target}", {"run": run_id})
        return
    yield from watch(job, run_id, deadline=deadline)


def _check(job: Job, result: Any, what: str) -> None:
    if result.exit_code != 0:
        raise RemoteError(f"{job.target.name}: could not {what} (exit {result.exit_code}): {job.mask(result.err.strip())[-400:]}")


def plan(job: Job) -> list[tuple[str, str]]:
    """Every command a launch would send, rendered exactly (secrets masked): (step, command)."""
    t = job.transport
    run_id = "<run-id>"
    rid = "00000000-000000-000000"
    steps: list[tuple[str, str]] = [
        ("preflight (lock + probe, one round trip)", t.render(bash(lock_script(job.session, "<user@machine pid N>", probe_script((job.session,)))))),
        ("create the run directory", t.render(bash(prepare_script(rid, job.session, _meta(job, rid, "warmup"))))),
    ]
    if job.playbook.warmup:
        for gpu in job.playbook.warmup.gpus:
            steps.append((f"warmup GPU {gpu}", t.render(bash(warmup_script(job.playbook, rid, gpu, local=job.local)))))
            steps.append((f"after warmup GPU {gpu}: poll its memory until it drains", t.render(bash(gpu_memory_script((gpu,))))))
    steps.append(("start in tmux", t.render(bash(start_script(job.playbook, rid, _meta(job, rid, "running"), run_sh(job.playbook, rid, local=job.local))))))
    steps.append(("follow the log", t.render(follower_command(rid, job.session, 0, 0, -1, False))))
    ab = job.playbook.abort
    steps.append(("on a match or stall: abort", t.render(bash(abort_script(job.session, rid, ab.signal, ab.grace, "<abort record>", job.run_gpus, job.playbook.preflight.max_memory_used_mib)))))
    steps.append(("after the run: reap leftover processes", t.render(bash(kill_marked_script(f"GPUOPS_RUN_ID={rid}")))))
    if job.playbook.warmup:
        failed = _meta(job, rid, "warmup-failed", error="<error>", warmup_seconds={})
        steps.append(("if a warmup fails: reap its processes as above, then record it",
                      t.render(bash(write_record(rid, "meta.json", failed)))))
    # Secret env values render as ***; a secret also written literally into a command is masked too.
    return [(name, job.mask(text.replace(rid, run_id))) for name, text in steps]


def stop(job: Job) -> Iterator[Event | Outcome]:
    """Abort the current run the way a matched signature does; success once no run is alive."""
    from gpuops.flow.abort import abort_run
    from gpuops.probe import parse_probe

    probe = parse_probe(job.run(bash(probe_script((job.session,)))).out)
    state = probe.sessions.get(job.session)
    info = state.run if state else None
    if state is not None and state.locked_by and info is not None and info.meta.get("phase") in ("preflight", "warmup"):
        yield from _stop_launch(job, info)
        return
    if state is None or not state.alive:
        if info is not None:
            reap(job, info.run_id, persistent=False)
        yield Outcome("not-running", ExitCode.OK, f"no run of '{job.session}' is alive on {job.target.name}", {"run": info.run_id if info else None})
        return
    run_id = info.run_id if info else "unknown"
    yield Event("abort_start", job.target.name, run_id, {"reason": "stop"})
    if info is None:
        job.run(Cmd("tmux", "kill-session", "-t", f"={job.session}"))
        yield Outcome("stopped", ExitCode.OK, f"tmux session '{job.session}' killed (no run record)", {})
        return
    result = abort_run(job, run_id, "stop")
    yield Event("aborted", job.target.name, run_id, {"reason": "stop", "survivors": result.survivors, "gpus": result.gpus,
                                                     "seconds": round(result.seconds, 3)})
    if result.survivors:
        raise GpuopsError(f"{job.target.name}: processes {result.survivors} of run {run_id} survived SIGKILL")
    yield Outcome("stopped", ExitCode.OK, f"run {run_id} stopped", {"run": run_id})


def _stop_launch(job: Job, info: Any) -> Iterator[Event | Outcome]:
    """A launch still warming up: record the stop (the launcher checks before each step), kill its warmup."""
    from gpuops.flow.abort import abort_record

    run_id = info.run_id
    yield Event("abort_start", job.target.name, run_id, {"reason": "stop", "phase": info.meta.get("phase")})
    job.run(bash(write_record(run_id, "abort.json", dumps(abort_record(job, "stop")))))
    reap(job, run_id, persistent=False)
    yield Outcome("stopped", ExitCode.OK, f"launch of run {run_id} stopped during its warmup; training will not start", {"run": run_id})
