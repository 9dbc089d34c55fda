"""`gpuops launch` of a playbook with `launch.nodes`: one job over its nodes (client/launch/nodes_launch.py), then each
node followed as a target is (lines prefixed with the node), and the job's one summary: the first failing node's."""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

from gpuops.cli.flows.fanout import Fanout
from gpuops.cli.flows.run_flow import renderer
from gpuops.client.events import Outcome
from gpuops.errors import ExitCode, GpuopsError

if TYPE_CHECKING:
    from gpuops.cli.roles import Render, Report, Terminal
    from gpuops.client.nodes import Node
    from gpuops.client.play import Play


def run_job(plays: list[Play], *, detach: bool, timeout: float | None, as_json: bool, verbose: bool, report: Report) -> int:
    """Start the job, then (unless detached) follow every node; the exit code is the first failing node's."""
    import time

    from gpuops.client.launch.nodes_launch import launch_job
    from gpuops.client.nodes import check_nodes

    check_nodes(plays)
    deadline = time.monotonic() + timeout if timeout else None
    render = renderer(as_json, verbose, multi=True)
    first = plays[0].target.name
    nodes: list[Play] = []
    started: Outcome | None = None
    try:
        gen = launch_job(plays, detach=detach, timeout=timeout)
        for item in gen:
            if isinstance(item, Outcome):
                if detach:
                    render.outcome(item, first)
                    return item.exit_code
                started = item
                break
            render.event(item)
        if started is None:  # launch_job's last item is its Outcome: a launch that ended without one is a bug
            raise RuntimeError("the job's launch ended without its outcome")
        nodes = _node_plays(plays, started)
    except GpuopsError as exc:
        from gpuops.cli.options import error_outcome
        from gpuops.cli.renderers.render import JsonRenderer

        exc.target = exc.target or first
        if isinstance(render, JsonRenderer):  # --json
            render.outcome(error_outcome(exc.exit_code, "error", str(exc), exc.hint, exc), exc.target)
            if render.held is not None:
                render.release(lambda obj: 0)
            return exc.exit_code
        raise
    left = None if deadline is None else max(1.0, deadline - time.monotonic())
    return follow_job(nodes, started.data["run"], render, report, as_json=as_json, verbose=verbose, timeout=left)


def _node_plays(plays: list[Play], started: Outcome) -> list[Play]:
    """The nodes' plays as the launch made them (each knows its place in the job) from the launch's records."""
    from gpuops.client.nodes import Node

    names = tuple(started.data["nodes"])
    run = started.data["run"]
    return [_with_node(j, Node(rank, names, run, "")) for rank, j in enumerate(plays)]


def _with_node(play: Play, node: Node) -> Play:
    import dataclasses

    return dataclasses.replace(play, node=node)


def follow_job(nodes: list[Play], run_id: str, render: Terminal, report: Report, *, as_json: bool, verbose: bool,
               timeout: float | None) -> int:
    """Every node followed at once (each in a worker, as several targets are), then the job's summary."""
    import time

    deadline = time.monotonic() + timeout if timeout else None
    work = functools.partial(_follow_one, run_id=run_id, deadline=deadline)
    return fan_job(nodes, work, run_id, render, report, as_json=as_json, verbose=verbose)


def fan_job(nodes: list[Play], work: Any, run_id: str, render: Terminal, report: Report, *, as_json: bool,
            verbose: bool) -> int:
    """`work` for every node at once (each in a worker, as several targets are: `launch` and `logs -f` follow so),
    then the job's one summary, the last word: the first failing node's code, not the worst of the nodes'."""
    from gpuops.cli.renderers.render import JsonRenderer
    from gpuops.client.launch.nodes_launch import node_ends
    from gpuops.client.nodes import job_outcome

    fan = Fanout(nodes, lambda play: report.wrap(render, play), render, report, as_json=as_json, sum_up=False)
    fan.run(work)
    out = job_outcome(run_id, node_ends(nodes, run_id))
    if verbose:
        conns, cmds = fan.cost()
        sys.stderr.write(f"gpuops: {conns} SSH connection(s), {cmds} remote command(s)\n")
    target = out.data.get("first_failing_node") or nodes[0].target.name
    if isinstance(render, JsonRenderer):  # --json
        render.release(lambda obj: 0)
        render.outcome(out, target)  # the last line: the job's summary
    else:
        render.say(("gpuops: " if out.exit_code == 0 else f"gpuops: {out.outcome.upper()} (exit {out.exit_code}): ")
                   + out.message)
    for play in nodes:
        play.transport.close()
    return out.exit_code


def _follow_one(play: Play, render: Render, *, run_id: str, deadline: float | None) -> int:
    from gpuops.cli.flows.run_flow import drive
    from gpuops.client.view.viewer import view

    state: dict[str, Any] = {"started": True, "run": run_id}
    try:
        return drive(view(play, run_id, deadline=deadline), render, play.target.name, state)
    except KeyboardInterrupt:
        render.outcome(Outcome("interrupted", ExitCode.INTERRUPTED, f"stopped following node {play.target.name}; the job "
                               "goes on, guarded by each node's watchdog (`gpuops stop -p PLAYBOOK` stops every node)",
                               {"run": run_id, "run_alive": True}), play.target.name)
        return ExitCode.INTERRUPTED
    finally:
        play.transport.close()
