"""Shell completion through click's own protocol (bash, zsh, fish): `_GPUOPS_COMPLETE=bash_source gpuops`.

-t completes the target names (and, where it is repeatable, the group names) of the inventory
given with -i or in GPUOPS_INVENTORY; -i, -p and --junit complete as file paths. Completing reads
the inventory file and nothing else: it never connects anywhere, and a bad file completes nothing.
"""

from __future__ import annotations

import os
from typing import Any

import click

COMPLETE_VAR = "_GPUOPS_COMPLETE"  # click's name for it: _{PROG}_COMPLETE
FILE_OPTIONS = ("inventory", "playbook", "junit")
TARGET_OPTIONS = ("target", "targets")


class FileName(click.ParamType):
    """A path taken as written (the command reports a missing file itself), completed as a file by the shell."""

    name = "path"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        return [CompletionItem(incomplete, type="file")]


class TargetName(click.ParamType):
    """A target name (or, with groups=True, an inventory group that stands for its targets)."""

    name = "name"

    def __init__(self, *, groups: bool) -> None:
        self.groups = groups

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        inventory = _inventory(ctx)
        if inventory is None:
            return []
        items = [CompletionItem(name, help=_where(target)) for name, target in inventory.targets.items()
                 if name.startswith(incomplete)]
        if self.groups:
            items += [CompletionItem(name, help=f"group of {len(members)} target(s)")
                      for name, members in inventory.groups.items()
                      if members and name.startswith(incomplete) and name not in inventory.targets]
        return items


def _where(target: Any) -> str:
    return f"CT {target.ctid} on {target.host}" if target.ctid is not None else f"on {target.host}"


def _inventory(ctx: click.Context) -> Any:
    """The inventory named on the command line being completed, else in GPUOPS_INVENTORY; None if unreadable."""
    path = ctx.params.get("inventory") or os.environ.get("GPUOPS_INVENTORY")
    if not path:
        return None
    try:
        from gpuops.config import load_inventory

        return load_inventory(os.path.expanduser(str(path)))
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


def install(group: click.Group) -> None:
    """Give every command's shared -i/-p/--junit and -t options their completion (they are defined in common.py)."""
    if COMPLETE_VAR in os.environ:  # a completion request: only then is click's completion module needed
        import click.shell_completion as shell_completion

        shell_completion.add_completion_class(_fish_class(), "fish")
    for command in group.commands.values():
        for param in command.params:
            if param.name in FILE_OPTIONS:
                param.type = FileName()
            elif param.name in TARGET_OPTIONS:
                param.type = TargetName(groups=bool(getattr(param, "multiple", False)))
