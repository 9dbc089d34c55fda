"""Shell completion through click's own protocol (bash, zsh, fish): `_GPUOPS_COMPLETE=bash_source gpuops`.

Each option declares its completion where it is defined (`shell_complete=`, with the callbacks
here). -t completes the target names (and, where it is repeatable, the group names) of the inventory
given with -i or in GPUOPS_INVENTORY; -i, -p and --junit complete as file paths. Completing those
reads the inventory file and nothing else: it never connects anywhere, and a bad file completes
nothing. `logs --run` completes run ids, which live on the target only: that one connects, for at
most RUN_ID_BUDGET seconds, and completes nothing (and says nothing) when the target does not answer.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from gpuops.targets import Inventory, Target

COMPLETE_VAR = "_GPUOPS_COMPLETE"  # click's name for it: _{PROG}_COMPLETE
RUN_ID_BUDGET = 3.0  # seconds a completion may wait for the target's run ids: a prompt must not hang
RUN_IDS = 50  # the newest run directories read


def files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """-i, -p, --junit: a path, completed as a file by the shell (the command reports a missing file itself)."""
    from click.shell_completion import CompletionItem

    return [CompletionItem(incomplete, type="file")]


def target_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """-t of a command on one target: the inventory's target names."""
    return _targets(ctx, incomplete, groups=False)


def targets_and_groups(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """A repeatable -t: target names, and the inventory groups that stand for their targets."""
    return _targets(ctx, incomplete, groups=True)


def run_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """`logs --run`: a run id (`gpuops runs` lists them), completed from the target's run directories."""
    return complete_run_ids(ctx, incomplete)


def _targets(ctx: click.Context, incomplete: str, *, groups: bool) -> list[Any]:
    from click.shell_completion import CompletionItem

    inventory = _inventory(ctx)
    if inventory is None:
        return []
    items = [CompletionItem(name, help=_where(target)) for name, target in inventory.targets.items()
             if name.startswith(incomplete)]
    if groups:
        items += [CompletionItem(name, help=f"group of {len(members)} target(s)")
                  for name, members in inventory.groups.items()
                  if members and name.startswith(incomplete) and name not in inventory.targets]
    return items


def complete_run_ids(ctx: click.Context, incomplete: str, budget: float = RUN_ID_BUDGET) -> list[Any]:
    """The run ids of the playbook's session on the target (the first -t, else the playbook's), newest first."""
    import threading

    from click.shell_completion import CompletionItem

    found: list[dict[str, Any]] = []
    worker = threading.Thread(target=_read_run_ids, args=(ctx, found), daemon=True)  # abandoned past the budget
    worker.start()
    worker.join(budget)
    if worker.is_alive():
        return []
    return [CompletionItem(row["run"], help=f"{row.get('outcome')}, started {row.get('started') or '?'}")
            for row in list(found) if str(row["run"]).startswith(incomplete)]


def _read_run_ids(ctx: click.Context, found: list[dict[str, Any]]) -> None:
    """Connect once (no retries), read the history; anything that goes wrong completes nothing, silently.
    The target is the one `logs` itself would pick (client/selection.py): the first -t, else the playbook's."""
    try:
        from gpuops.client.door import Door
        from gpuops.client.selection import select_targets
        from gpuops.transport import Pool

        sel = select_targets(_path(ctx, "inventory", "GPUOPS_INVENTORY"), _path(ctx, "playbook", "GPUOPS_PLAYBOOK"),
                             tuple(ctx.params.get("targets") or ()), run=True, need_env=False)
        target, pb = sel.targets[0], sel.playbook
        assert pb is not None  # run=True: the playbook is required
        pool = Pool(sel.inventory, retry_time=0)
        try:
            rows = Door(pool.target(target), label=target.name).runs(RUN_IDS, timeout=RUN_ID_BUDGET)
        finally:
            pool.close()
        found.extend(r for r in rows if r.get("session") == pb.launch.session)
    except Exception:  # noqa: BLE001 - a completion must never print into the prompt
        return


def _path(ctx: click.Context, name: str, env: str) -> str | None:
    """A file named on the command line being completed (not yet expanded by the shell), else in `env`."""
    path = ctx.params.get(name) or os.environ.get(env)
    return os.path.expanduser(str(path)) if path else None


def _where(target: Target) -> str:
    return f"CT {target.ctid} on {target.host}" if target.ctid is not None else f"on {target.host}"


def _inventory(ctx: click.Context) -> Inventory | None:
    """The inventory named on the command line being completed, else in GPUOPS_INVENTORY; None if unreadable."""
    path = _path(ctx, "inventory", "GPUOPS_INVENTORY")
    if not path:
        return None
    try:
        from gpuops.config import load_inventory

        return load_inventory(path)
    except Exception:  # a completion must never print a traceback into the prompt; `gpuops validate` says why
        return None


# click 8.4's fish script splits each answer on a raw newline and reads three lines as one answer, so
# fish completes nothing; this is click 8.1's layout (one line per answer: type,value<TAB>help).
_FISH_SOURCE = """\
function %(complete_func)s;
    set -l response (env %(complete_var)s=fish_complete COMP_WORDS=(commandline -cp) \
COMP_CWORD=(commandline -t) %(prog_name)s);

    for completion in $response;
        set -l metadata (string split -m 1 "," -- $completion);

        if test $metadata[1] = "dir";
            __fish_complete_directories $metadata[2];
        else if test $metadata[1] = "file";
            __fish_complete_path $metadata[2];
        else if test $metadata[1] = "plain";
            echo $metadata[2];
        end;
    end;
end;

complete --no-files --command %(prog_name)s --arguments "(%(complete_func)s)";
"""


def _fish_class() -> Any:
    from click.shell_completion import FishComplete

    class Fish(FishComplete):
        """click's fish protocol with a script that works in fish 3 and 4 (one answer per line)."""

        source_template = _FISH_SOURCE

        def format_completion(self, item: Any) -> str:
            value = item.value.replace("\n", " ")
            return f"{item.type},{value}\t{item.help.splitlines()[0]}" if item.help else f"{item.type},{value}"

    return Fish


def use_fish_script() -> None:
    """On a completion request (only then is click's completion module needed): fish gets the working script."""
    if COMPLETE_VAR in os.environ:
        import click.shell_completion as shell_completion

        shell_completion.add_completion_class(_fish_class(), "fish")
