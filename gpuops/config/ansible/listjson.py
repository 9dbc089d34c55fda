"""The JSON `ansible-inventory --list` prints, as an inventory: templates, vault, plugins and dynamic
inventories are then Ansible's own work. Shape: {"_meta": {"hostvars": {...}}, "all": {...}, GROUP: {...}}."""

from __future__ import annotations

from gpuops.config import schema as s
from gpuops.config.source import Source
from gpuops.config.yamlpos import Mapping, Scalar, Sequence
from gpuops.errors import ConfigError
from gpuops.targets import Inventory


def accepts(source: Source) -> bool:
    """A mapping with `_meta` (holding `hostvars`) and `all`: what ansible-inventory --list prints."""
    if not source.parses() or not isinstance(source.root, Mapping):
        return False
    keys = source.top_keys()
    if not {"_meta", "all"} <= keys:
        return False
    meta = next(v for k, v in source.root.pairs if isinstance(k, Scalar) and k.text == "_meta")
    return isinstance(meta, Mapping) and any(isinstance(k, Scalar) and k.text == "hostvars" for k, _ in meta.pairs)


def load(source: Source) -> Inventory:
    from gpuops.config.ansible.build import inventory_of  # the Ansible model: for an Ansible file only
    from gpuops.config.ansible.tree import Tree, yaml_vars

    tree = Tree(source.path, var_files=False)  # its hostvars already hold group_vars/ and host_vars/
    root = source.root
    assert isinstance(root, Mapping)
    hostvars = {}
    for key, value in s.entries(root, "the inventory"):
        if key.text == "_meta":
            for k, v in s.entries(value, "_meta"):
                if k.text == "hostvars":
                    hostvars = {h.text: (h, vs) for h, vs in s.entries(v, "_meta.hostvars")}
            continue
        group = tree.group(key.text, key.mark)
        sec = s.Section(value, f"group '{key.text}'", ("children", "hosts", "vars"))
        if (n := sec.get("vars")) is not None:
            group.vars.update(yaml_vars(n, f"the vars of group '{key.text}'"))
        for field in ("children", "hosts"):
            node = sec.get(field)
            if node is None:
                continue
            if not isinstance(node, Sequence):
                raise ConfigError(node.mark, f"expected a list of names for the {field} of group '{key.text}'")
            for item in node.items:
                if not isinstance(item, Scalar):
                    raise ConfigError(item.mark, f"expected a name in the {field} of group '{key.text}'")
                if field == "children":
                    tree.add_child(group, item.text, item.mark)
                else:
                    mark_node, variables = hostvars.get(item.text, (item, None))
                    tree.add_host(group, item.text, mark_node.mark,
                                  yaml_vars(variables, f"host '{item.text}'") if variables is not None else {})
    for name, (key, variables) in hostvars.items():
        if name not in tree.hosts:  # only in hostvars: ungrouped, as Ansible has it
            tree.add_host(tree.group("ungrouped", key.mark), name, key.mark, yaml_vars(variables, f"host '{name}'"))
    return inventory_of(tree)
