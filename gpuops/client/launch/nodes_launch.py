"""Launch one job over its nodes: every node's preflight, then the run on each, then torchrun on each.

Nothing starts anywhere until every node passed preflight (each node's launch lock is held until all
have started); a node that fails to warm up or start stops the nodes already started. Following the
started job is the CLI's (each node followed as a target is, cli/flows/job_flow.py).
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from gpuops.client.events import Event, Outcome
from gpuops.client.gpu_health import XidsSoon, meta_state, start_host_watch
from gpuops.client.launch.preflight import LaunchLock, evaluate, xid_window
from gpuops.client.launch.run_id import new_run_id
from gpuops.client.launch.sequential_warmup import WarmupError, run_warmups, stop_warmup
from gpuops.client.launch.uninterruptible import shielded
from gpuops.client.nodes import each, endpoint, node_plays, side_by_side, turns
from gpuops.client.play import Play
from gpuops.errors import ExitCode, GpuopsError


def launch_job(plays: list[Play], *, detach: bool = False, timeout: float | None = None) -> Iterator[Event | Outcome]:
    """Preflight on every node, then warm up, start; the last item is the Outcome of the start (the follow is the caller's)."""
    from gpuops.client.launch.launch import _prepare, _record, _start

    began = time.monotonic()
    deadline = began + timeout if timeout else None
    locks = [LaunchLock(j) for j in plays]
    soon = [XidsSoon(j, xid_window(j)) for j in plays]  # each node's host's kernel log, beside the locks
    nodes: list[Play] = []
    started: list[Play] = []
    run_id: str | None = None
    try:
        probes = each(locks, lambda lock: lock.acquire())
        failed = [(j, p) for j, p in zip(plays, probes, strict=True) if isinstance(p, BaseException)]
        if failed:
            raise _first(failed)
        replies = [p for p in probes if not isinstance(p, BaseException)]  # every one, none failed
        healths = {}
        for play, probe, xids in zip(plays, replies, soon, strict=True):
            healths[play.target.name] = yield from evaluate(play, probe, xids.result())
        run_id = new_run_id()
        rdzv, how = endpoint(plays)
        nodes = node_plays(plays, run_id, rdzv)
        yield Event("job_planned", plays[0].target.name, run_id,
                    {"job": run_id, "nodes": [j.target.name for j in plays], "rdzv_endpoint": rdzv, "found_by": how})
        for play in nodes:
            _prepare(play, run_id)
            yield Event("run_created", play.target.name, run_id, {"session": play.session, "node_rank": play.node.rank})
        durations: dict[str, dict[str, float]] = {j.target.name: {} for j in nodes}

        def warm(group: list[Play]) -> Iterator[Event]:
            for play in group:
                for ev in run_warmups(play, run_id, deadline=deadline):
                    if ev.kind == "warmup_done":
                        durations[play.target.name][str(ev.get("gpu"))] = ev.get("seconds")
                    yield ev

        try:
            yield from side_by_side(turns(nodes), warm)
        except (KeyboardInterrupt, GeneratorExit):
            for play in nodes:
                stop_warmup(play, run_id, durations[play.target.name])
            raise
        except WarmupError as exc:
            for play in nodes:
                _record(play, run_id, "warmup-failed", quiet=True, error=play.mask(str(exc)),
                        warmup_seconds=durations[play.target.name])
            raise
        for play in nodes:
            health = healths.get(play.target.name)
            _start(play, run_id, durations[play.target.name], host_kernel_log=meta_state(play, health))
            started.append(play)
            yield Event("started", play.target.name, run_id, {
                "session": play.session, "log": f"~/.gpuops/runs/{run_id}/log", "warmup_seconds": durations[play.target.name],
                "watchdog": True, "node_rank": play.node.rank, "command": play.mask(play.playbook.launch.command)})
            yield from start_host_watch(play, run_id, health, began)
    except GpuopsError:
        if run_id is not None:
            _undo(nodes, started, run_id)
        raise
    finally:
        with shielded():
            for lock in locks:
                lock.release()
    names = ", ".join(f"{j.target.name} (rank {j.node.rank})" for j in nodes)
    yield Outcome("started", ExitCode.OK, f"job {run_id} started on {len(nodes)} nodes: {names}; each node's watchdog "
                  "ends the job on every node on a fatal signature, a stall or a failure",
                  {"run": run_id, "job": run_id, "nodes": [j.target.name for j in nodes], "attempts": 1,
                   "detached": detach})


def _first(failed: list[tuple[Play, BaseException]]) -> BaseException:
    """The error to report when some nodes could not be locked: the first node's (a bug before a refusal)."""
    for _, exc in failed:
        if not isinstance(exc, GpuopsError):
            return exc
    return failed[0][1]


def _undo(nodes: list[Play], started: list[Play], run_id: str) -> None:
    """A node failed after the run existed: stop the nodes already started, record the others as never started."""
    from gpuops.client.launch.launch import _record
    from gpuops.client.stop_call import abort_run

    with shielded():
        for play in started:
            try:
                abort_run(play, run_id, "stop", by="client")
            except GpuopsError:
                pass
        for play in nodes:
            if play not in started:
                _record(play, run_id, "start-failed", quiet=True, error="another node of the job failed to start")


def node_ends(nodes: list[Play], run_id: str) -> list[Any]:
    """Each node's end, read from its records (after the follow)."""
    from gpuops.client.nodes import NodeEnd
    from gpuops.client.outcome import run_info

    infos = each(nodes, lambda j: run_info(j, run_id))
    ends = []
    for rank, (play, info) in enumerate(zip(nodes, infos, strict=True)):
        if isinstance(info, BaseException) or info is None:
            ends.append(NodeEnd(play.target.name, rank, "unknown", None, None))
            continue
        from gpuops.agent.wire.records import outcome

        exit_text = None if info.exit_code is None else str(info.exit_code)
        state, code = outcome(exit_text, info.abort, info.session_alive)
        hang = (info.abort_done or {}).get("hang")
        ends.append(NodeEnd(play.target.name, rank, str(getattr(state, "value", state)), code, info.abort,
                            hang if isinstance(hang, dict) else None))
    return ends
