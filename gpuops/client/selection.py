"""The one target selection policy of every command: -t names and groups, --all, else the playbook's target
(or its launch.nodes), else the inventory's only target; and a Play per target chosen, each with its own
transport. The CLI passes the paths and names it was given; what they select is decided here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuops.errors import UsageError

if TYPE_CHECKING:
    from gpuops.client.play import Play
    from gpuops.config.playbook_model import Playbook
    from gpuops.targets import Inventory, Target


@dataclass
class Selection:
    """What a command acts on: the inventory, the playbook (if one was given) and the targets asked for."""

    inventory: Inventory
    playbook: Playbook | None
    targets: list[Target]


def require(path: str | None, what: str, env: str) -> str:
    """The file named by --WHAT or its environment variable; a usage error (exit 2) when neither is given."""
    if not path:
        raise UsageError(f"no {what} given: pass --{what} PATH or set {env}")
    return path


def select_targets(inventory: str | None, playbook: str | None, names: tuple[str, ...], every: bool = False, *,
                   run: bool = False, need_env: bool = False) -> Selection:
    """The targets asked for. `run`: a command that acts on a run (launch, logs, stop) needs the playbook,
    defaults to its target, and checks every target against its GPUs; the others (status, runs) take an
    optional playbook and default to its target, else to every target of the inventory."""
    from gpuops.config import load_inventory, load_playbook, resolve_target
    from gpuops.config.inventory import resolve_targets, usable

    inv = load_inventory(require(inventory, "inventory", "GPUOPS_INVENTORY"))
    pb: Playbook | None
    if run:
        pb = load_playbook(require(playbook, "playbook", "GPUOPS_PLAYBOOK"), need_env=need_env)
    else:
        pb = load_playbook(playbook, need_env=need_env) if playbook else None
    if every:
        chosen = usable(inv, [*inv.targets, *inv.broken])  # a target that cannot be used is said, not skipped
    elif names:
        chosen = resolve_targets(inv, names)  # a group name selects its targets
    elif pb is not None and pb.launch.nodes:
        chosen = node_targets(inv, pb)  # one torchrun job: every node (docs/torchrun.md)
    elif run and pb is not None and not pb.target and len(inv.targets) == 1 and not inv.broken:
        chosen = list(inv.targets.values())  # the inventory's only target: no -t needed
    elif run or (pb is not None and pb.target):
        chosen = [resolve_target(inv, pb, None)]
    else:
        chosen = usable(inv, [*inv.targets, *inv.broken])
    if run:
        chosen = [resolve_target(inv, pb, t.name) for t in chosen]  # each checked against the playbook's GPUs
    if not chosen:
        raise UsageError(f"{inventory}: no targets defined")
    return Selection(inv, pb, chosen)


def node_targets(inv: Inventory, pb: Playbook) -> list[Target]:
    """The targets of launch.nodes, node 0 first; one the inventory lacks is an error at its line (exit 2)."""
    from gpuops.config import schema as s
    from gpuops.errors import ConfigError

    marks = pb.launch.node_marks or (None,) * len(pb.launch.nodes)
    for name, mark in zip(pb.launch.nodes, marks, strict=True):
        if name not in inv.targets and name not in inv.broken:
            raise ConfigError(mark, f"launch.nodes names '{name}', which is not a target of {inv.path} "
                              f"(targets: {', '.join(inv.targets) or 'none'}){s.suggest(name, inv.targets)}", file=pb.path)
    from gpuops.config.inventory import usable

    return usable(inv, pb.launch.nodes)


def load_plays(inventory: str | None, playbook: str | None, names: tuple[str, ...], every: bool = False, *,
               dry: bool = False, need_env: bool = True) -> list[Play]:
    """A Play per target asked for, each with a transport of its own, so that one target's dead link or
    reconnect never touches another's."""
    from gpuops.client.play import Play
    from gpuops.transport import Pool, dry_transport

    sel = select_targets(inventory, playbook, names, every, run=True, need_env=need_env)
    inv, pb = sel.inventory, sel.playbook
    assert pb is not None  # run=True: the playbook is required
    return [Play(inv, pb, t, dry_transport(inv, t) if dry else Pool(inv).target(t)) for t in sel.targets]
