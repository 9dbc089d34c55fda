"""The Ansible YAML inventory plugin: `all: {hosts, children, vars}`, other top-level groups under all.

Every inventory file is asked whether it is one (accepts), so the Ansible model (tree, build) is
imported only once a file is read as Ansible YAML: a gpuops inventory does not pay for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuops.config import schema as s
from gpuops.config.inventory import INVENTORY_KEYS
from gpuops.config.source import Source
from gpuops.config.yamlpos import Mapping, Node, Scalar
from gpuops.targets import Inventory

if TYPE_CHECKING:
    from gpuops.config.ansible.tree import Group, Tree


def accepts(source: Source) -> bool:
    """YAML whose top level is groups (`all`, or a group with hosts/children/vars), without gpuops' own keys."""
    if not source.parses() or not isinstance(source.root, Mapping):
        return False
    keys = source.top_keys()
    if keys & set(INVENTORY_KEYS):
        return False  # hosts: / targets: make it a gpuops inventory
    return "all" in keys or any(_has_group_keys(v) for _, v in source.root.pairs)


def load(source: Source) -> Inventory:
    from gpuops.config.ansible.build import inventory_of
    from gpuops.config.ansible.tree import Tree

    tree = Tree(source.path)
    root = source.root
    assert root is not None
    parse_yaml(root, tree)
    return inventory_of(tree)


def _has_group_keys(node: Node) -> bool:
    from gpuops.config.ansible.tree import GROUP_KEYS

    return isinstance(node, Mapping) and any(isinstance(k, Scalar) and k.text in GROUP_KEYS for k, _ in node.pairs)


def parse_yaml(root: Node, tree: Tree) -> None:
    """`all: {hosts, children, vars}`; other top-level groups are children of all."""
    for key, value in s.entries(root, "the inventory"):
        group = tree.group(key.text, key.mark)
        if group.name != "all":
            tree.add_child(tree.groups["all"], group.name, key.mark)
        _yaml_group(tree, group, value)


def _yaml_group(tree: Tree, group: Group, node: Node) -> None:
    from gpuops.config.ansible.tree import GROUP_KEYS, yaml_vars

    if s.is_null(node):
        return
    sec = s.Section(node, f"group '{group.name}'", GROUP_KEYS)
    if (n := sec.get("vars")) is not None:
        group.vars.update(yaml_vars(n, f"the vars of group '{group.name}'"))
    if (n := sec.get("hosts")) is not None:
        for key, value in s.entries(n, f"the hosts of group '{group.name}'"):
            variables = {} if s.is_null(value) else yaml_vars(value, f"host '{key.text}'")
            tree.add_host(group, key.text, key.mark, variables)
    if (n := sec.get("children")) is not None:
        for key, value in s.entries(n, f"the children of group '{group.name}'"):
            _yaml_group(tree, tree.add_child(group, key.text, key.mark), value)
