"""An Ansible tree as a gpuops inventory: hosts (equal ssh settings shared), targets and groups."""

from __future__ import annotations

import os
from types import MappingProxyType

from gpuops.config.ansible.hosts import HostBuilder
from gpuops.config.ansible.layers import Layers
from gpuops.config.ansible.tree import HostValueError, Tree, VaultedValue
from gpuops.errors import ConfigError
from gpuops.targets import Inventory, Target


def inventory_of(tree: Tree) -> Inventory:
    """The inventory a parsed tree declares, with Ansible's implicit groups and variable layers."""
    tree.reconcile()
    layers = Layers(tree)
    builder = HostBuilder(tree, layers)
    targets: dict[str, Target] = {}
    broken: dict[str, ConfigError] = {}
    for name in tree.hosts:
        try:
            target = builder.target(name)
        except HostValueError as exc:  # a template, a vaulted value, an ssh option: this target only fails, when used
            if isinstance(exc, VaultedValue):  # its way out names this inventory: Ansible cannot read --list JSON back
                exc = exc.in_inventory(tree.path if tree.var_files else "INVENTORY", name)
            broken[name] = exc
            continue
        if target is not None:
            targets[name] = target
    groups = {
        name: tuple(h for h in tree.hosts if (h in targets or h in broken) and name in layers.groups_of(h))
        for name in tree.groups
    }
    return Inventory(path=os.path.abspath(tree.path), hosts=MappingProxyType(dict(builder.hosts)),
                     targets=MappingProxyType(targets), groups=MappingProxyType(groups),
                     broken=MappingProxyType(broken))
