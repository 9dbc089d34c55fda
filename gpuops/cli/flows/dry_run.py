"""`gpuops launch --dry-run`: every command a launch would send, quoted exactly, and nothing connects; for a
torchrun job, each node's torchrun command first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuops.client.events import Outcome
from gpuops.client.selection import load_plays
from gpuops.errors import ExitCode

if TYPE_CHECKING:
    from gpuops.cli.renderers.render import JsonRenderer
    from gpuops.client.play import Play


def dry_run(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, as_json: bool) -> int:
    from gpuops.cli.renderers.render import JsonRenderer
    from gpuops.client.nodes import is_job

    plays = load_plays(inventory, playbook, targets, every, dry=True)
    out = JsonRenderer(hold_summaries=len(plays) > 1) if as_json else None

    if is_job(plays):
        dry_run_job(plays, out)
        if out is not None and out.held is not None:
            out.release(lambda obj: 0)
        return ExitCode.OK
    for i, play in enumerate(plays):
        if out is None and i:
            print()
        dry_run_one(play, out)
    if out is not None and out.held is not None:
        out.release(lambda obj: 0)
    return ExitCode.OK


def dry_run_one(play: Play, out: JsonRenderer | None) -> None:
    """Every command one target's launch would send; `out`: the JSON renderer with --json."""
    from gpuops.client.launch.launch import plan

    host = play.inventory.hosts[play.target.host]
    if host.transport == "local":
        where = "this machine (local), each command executed as argv without a login shell:"
    else:
        from gpuops.transport.describe import connection, spelled

        # The whole chain as ssh resolves it (`ssh -G`: nothing connects), each hop user@host:port.
        where = f"{spelled(connection(play.inventory, play.target))}, each line below sent as the remote command:"
    steps = plan(play)
    if out is not None:
        import time

        from gpuops.cli.renderers.render import iso

        for name, text, stdin in steps:
            out.emit({"ts": iso(time.time()), "event": "dry_run_step", "target": play.target.name, "step": name,
                      "command": text, **({"stdin": stdin} if stdin is not None else {})})
        out.outcome(Outcome("dry-run", ExitCode.OK, "nothing was run", {}), play.target.name)
        return
    print(f"# gpuops launch --dry-run: target {play.target.name} via {where}")
    for name, text, stdin in steps:
        print(f"\n# {name}")
        print(text)
        if stdin is not None:
            print(f"# stdin: {stdin}")


def dry_run_job(plays: list[Play], out: JsonRenderer | None) -> None:
    """Each node's torchrun command, then every command of each node's launch."""
    from gpuops.client.nodes import ADDRESS_PROBE, check_nodes, endpoint, node_plays

    check_nodes(plays)
    rdzv, how = endpoint(plays, dry=True)
    nodes = node_plays(plays, "<run-id>", rdzv, key="")
    if out is None:
        print(f"# gpuops launch --dry-run: job over {len(nodes)} nodes ({', '.join(j.target.name for j in nodes)}); "
              f"rendezvous endpoint {rdzv} (from {how})")
        if how.startswith("`hostname"):
            print(f"# NODE0_ADDRESS: the first address this prints on {plays[0].target.name}, asked at launch "
                  f"(or set rdzv_address for {plays[0].target.name} in the inventory):")
            print(plays[0].transport.wrap(ADDRESS_PROBE).render(display=True, mask=plays[0].mask))
        print("# --rdzv-id is $GPUOPS_RDZV_ID: the run id on attempt 1, <run-id>-a<N> on attempt N (a fresh rendezvous)")
        for play in nodes:
            print(f"# node {play.node.rank} ({play.target.name}) runs in tmux session '{play.session}':")
            print(play.mask(play.playbook.launch.command))
    for play in nodes:
        if out is None:
            print()
        dry_run_one(play, out)
