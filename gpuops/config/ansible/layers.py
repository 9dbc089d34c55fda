"""Each Ansible host's variables, layered the way Ansible layers them: groups by depth (child over
parent, then ansible_group_priority), group_vars/, the host itself, host_vars/."""

from __future__ import annotations

import os

from gpuops.config.ansible.tree import Tree, Var, yaml_vars
from gpuops.config.yamlpos import load
from gpuops.errors import ConfigError

VARS_SUFFIXES = ("", ".yml", ".yaml", ".json")


class Layers:
    """Each host's variables: groups by depth (child over parent), group_vars/, the host, host_vars/."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.base = tree.base
        self.parents: dict[str, set[str]] = {name: set() for name in tree.groups}
        for group in tree.groups.values():
            for child in group.children:
                self.parents[child].add(group.name)
        self.depth = _depths(tree)
        self._files: dict[tuple[str, str], dict[str, Var]] = {}
        self._groups: dict[str, set[str]] = {}

    def ancestors(self, group: str) -> set[str]:
        seen: set[str] = set()
        todo = [group]
        while todo:
            for parent in self.parents[todo.pop()]:
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen

    def groups_of(self, host: str) -> set[str]:
        """Every group the host is in, directly or through a child group."""
        if host not in self._groups:
            direct = {g.name for g in self.tree.groups.values() if host in g.hosts}
            self._groups[host] = direct.union(*(self.ancestors(g) for g in direct)) | {"all"}
        return self._groups[host]

    def host_vars(self, host: str) -> dict[str, Var]:
        groups = sorted(self.groups_of(host) - {"all"}, key=self._order)
        out = dict(self.tree.groups["all"].vars)
        for name in groups:
            out.update(self.tree.groups[name].vars)
        for name in ["all", *groups]:
            out.update(self.file_vars("group_vars", name))
        out.update(self.tree.hosts[host])
        out.update(self.file_vars("host_vars", host))
        return out

    def _order(self, group: str) -> tuple[int, int, str]:
        prio = self.tree.groups[group].vars.get("ansible_group_priority")
        value = prio.plain() if prio else 1
        return self.depth[group], value if isinstance(value, int) else 1, group

    def file_vars(self, folder: str, name: str) -> dict[str, Var]:
        """group_vars/<group>[.yml|.yaml|.json] and the files of a group_vars/<group>/ folder, beside the inventory."""
        if not self.tree.var_files:
            return {}
        if (folder, name) not in self._files:
            base = os.path.join(self.base, folder, name)
            paths = [base + ext for ext in VARS_SUFFIXES if os.path.isfile(base + ext)]
            if os.path.isdir(base):
                paths += [os.path.join(base, f) for f in sorted(os.listdir(base))
                          if not f.startswith(".") and os.path.splitext(f)[1] in VARS_SUFFIXES
                          and os.path.isfile(os.path.join(base, f))]
            out: dict[str, Var] = {}
            for path in paths:
                root = load(path, vault=True)
                if root is not None:
                    out.update(yaml_vars(root, f"the variables in {path}"))
            self._files[(folder, name)] = out
        return self._files[(folder, name)]


def _depths(tree: Tree) -> dict[str, int]:
    """A group's depth below all (Ansible's sort key); a group that contains itself is refused."""
    depth = {"all": 0}
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for child in tree.groups[name].children:
            if state.get(child) == 1:
                loop = [*path[path.index(child):], child] if child in path else [name, child]
                raise ConfigError(tree.groups[child].mark, f"group loop: {' -> '.join(loop)}")
            if depth.get(child, -1) < depth[name] + 1:
                depth[child] = depth[name] + 1
                visit(child, [*path, child])
        state[name] = 2

    visit("all", ["all"])
    for name in tree.groups:  # not below all: only a loop of groups that are each other's children
        if name not in depth:
            depth[name] = 1
            visit(name, [name])
    return depth
