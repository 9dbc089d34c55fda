"""An Ansible tree as a gpuops inventory: hosts (equal ssh settings shared), targets and groups."""

from __future__ import annotations

import os
from types import MappingProxyType

from gpuops.config.ansible.hosts import HostBuilder
from gpuops.config.ansible.layers import Layers
from gpuops.config.ansible.tree import Tree
from gpuops.config.model import Inventory, Target


def inventory_of(tree: Tree) -> Inventory:
    """The inventory a parsed tree declares, with Ansible's implicit groups and variable layers."""
    tree.reconcile()
    layers = Layers(tree)
    builder = HostBuilder(tree, layers)
    targets: dict[str, Target] = {}
    for name in tree.hosts:
        target = builder.target(name)
        if target is not None:
            targets[name] = target
    groups = {
        name: tuple(h for h in tree.hosts if h in targets and name in layers.groups_of(h)) for name in tree.groups
    }
    return Inventory(path=os.path.abspath(tree.path), hosts=MappingProxyType(dict(builder.hosts)),
                     targets=MappingProxyType(targets), groups=MappingProxyType(groups))
