"""`gpuops launch --dry-run`: every command a launch would send, quoted exactly, and nothing connects; for a
torchrun job, each node's torchrun command first."""

from __future__ import annotations

from typing import Any

from gpuops.cli.targets import load_jobs
from gpuops.client.events import Outcome
from gpuops.errors import ExitCode


def dry_run(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, as_json: bool) -> int:
    from gpuops.cli.job_cmd import is_job
    from gpuops.cli.render import JsonRenderer

    jobs = load_jobs(inventory, playbook, targets, every, dry=True)
    out = JsonRenderer(hold_summaries=len(jobs) > 1) if as_json else None

    if is_job(jobs):
        dry_run_job(jobs, out)
        if out is not None and out.held is not None:
            out.release(lambda obj: 0)
        return ExitCode.OK
    for i, job in enumerate(jobs):
        if out is None and i:
            print()
        dry_run_one(job, out)
    if out is not None and out.held is not None:
        out.release(lambda obj: 0)
    return ExitCode.OK


def dry_run_one(job: Any, out: Any) -> None:
    """Every command one target's launch would send; `out`: the JSON renderer with --json."""
    from gpuops.client.launch import plan

    host = job.inventory.hosts[job.target.host]
    if host.transport == "local":
        where = "this machine (local), each command executed as argv without a login shell:"
    else:
        from gpuops.transport.describe import connection, spelled

        # The whole chain as ssh resolves it (`ssh -G`: nothing connects), each hop user@host:port.
        where = f"{spelled(connection(job.inventory, job.target))}, each line below sent as the remote command:"
    steps = plan(job)
    if out is not None:
        import time

        from gpuops.cli.render import iso

        for name, text, stdin in steps:
            out.emit({"ts": iso(time.time()), "event": "dry_run_step", "target": job.target.name, "step": name,
                      "command": text, **({"stdin": stdin} if stdin is not None else {})})
        out.outcome(Outcome("dry-run", ExitCode.OK, "nothing was run", {}), job.target.name)
        return
    print(f"# gpuops launch --dry-run: target {job.target.name} via {where}")
    for name, text, stdin in steps:
        print(f"\n# {name}")
        print(text)
        if stdin is not None:
            print(f"# stdin: {stdin}")


def dry_run_job(jobs: list[Any], out: Any) -> None:
    """Each node's torchrun command, then every command of each node's launch."""
    from gpuops.client.nodes import ADDRESS_PROBE, check_nodes, endpoint, node_jobs

    check_nodes(jobs)
    rdzv, how = endpoint(jobs, dry=True)
    nodes = node_jobs(jobs, "<run-id>", rdzv, key="")
    if out is None:
        print(f"# gpuops launch --dry-run: job over {len(nodes)} nodes ({', '.join(j.target.name for j in nodes)}); "
              f"rendezvous endpoint {rdzv} (from {how})")
        if how.startswith("`hostname"):
            print(f"# NODE0_ADDRESS: the first address this prints on {jobs[0].target.name}, asked at launch "
                  f"(or set rdzv_address for {jobs[0].target.name} in the inventory):")
            print(jobs[0].transport.wrap(ADDRESS_PROBE).render(display=True, mask=jobs[0].mask))
        print("# --rdzv-id is $GPUOPS_RDZV_ID: the run id on attempt 1, <run-id>-a<N> on attempt N (a fresh rendezvous)")
        for job in nodes:
            print(f"# node {job.node.rank} ({job.target.name}) runs in tmux session '{job.session}':")
            print(job.mask(job.playbook.launch.command))
    for job in nodes:
        if out is None:
            print()
        dry_run_one(job, out)
