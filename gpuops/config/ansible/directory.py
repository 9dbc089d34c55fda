"""An Ansible inventory directory (`-i inventory/`): every file in it, in name order, merged into one
inventory as Ansible merges its sources; group_vars/ and host_vars/ beside them (in the directory)."""

from __future__ import annotations

import os

from gpuops.config.ansible.build import inventory_of
from gpuops.config.ansible.ini import parse_ini
from gpuops.config.ansible.tree import Tree
from gpuops.config.ansible.yamlfile import accepts as is_ansible_yaml
from gpuops.config.ansible.yamlfile import parse_yaml
from gpuops.config.source import Source
from gpuops.errors import ConfigError, UsageError
from gpuops.position import Mark
from gpuops.targets import Inventory

# Ansible's INVENTORY_IGNORE_EXTS and the names it always skips.
IGNORED_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry")
IGNORED_NAMES = ("group_vars", "host_vars", "vars_plugins")


def load(path: str) -> Inventory:
    tree = Tree(path, base=os.path.abspath(path))
    found = files(path)
    if not found:
        raise UsageError(f"{path}: is a directory with no inventory file in it (an Ansible inventory directory "
                         "holds INI or YAML inventory files)")
    for file in found:
        source = Source(file)
        if os.access(file, os.X_OK) and not source.yaml_named:
            raise ConfigError(Mark(file, 1, 1), "an executable file is a dynamic inventory script: gpuops does not "
                                               "run it; give -i the JSON of `ansible-inventory -i DIR --list`")
        if source.yaml_named:
            if not is_ansible_yaml(source):
                error = source.rejection()
                if error is not None:  # a YAML error is said at its place
                    raise error
                raise ConfigError(Mark(file, 1, 1), "expected an Ansible YAML inventory (groups at the top) in an "
                                                   "inventory directory")
            assert source.root is not None
            parse_yaml(source.root, tree)
        else:
            parse_ini(file, source.text, tree)
    return inventory_of(tree)


def files(folder: str) -> list[str]:
    """The inventory files of a folder as Ansible walks it: sorted names, hidden and ignored ones skipped."""
    out: list[str] = []
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if name.startswith(".") or name in IGNORED_NAMES or name.endswith(IGNORED_EXTS):
            continue
        if os.path.isdir(full):
            out += files(full)
        elif os.path.isfile(full):
            out.append(full)
    return out
