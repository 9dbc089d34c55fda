"""Ansible inventories (YAML or INI) read as gpuops inventories: each Ansible host becomes a target.

Variables are layered the way Ansible layers them; the ssh settings come from the ansible_*
variables and from ProxyJump / -J (or the `ssh -W %h:%p` ProxyCommand) in the ssh args.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuops.config import schema as s
from gpuops.config.model import Inventory, Target
from gpuops.config.yamlpos import Mapping, Node, Scalar, Sequence, load, read_text
from gpuops.errors import ConfigError, Mark

GROUP_KEYS = ("children", "hosts", "vars")
YAML_SUFFIXES = (".yml", ".yaml", ".json")
VARS_SUFFIXES = ("", ".yml", ".yaml", ".json")
MAX_RANGE = 10_000  # hosts one pattern such as node[001:999] may expand to
GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:[#;].*)?\Z")
_RANGE = re.compile(r"\[([0-9]+|[a-zA-Z]):([0-9]+|[a-zA-Z])(?::([0-9]+))?\]")


def sniff(path: str) -> tuple[str, Any]:
    """'gpuops', 'ansible-yaml' or 'ansible-ini', judged by the content (a .yml/.yaml name breaks ties)."""
    text = read_text(path)  # a missing or non-UTF-8 file: the same error for every kind
    yaml_named = path.lower().endswith(YAML_SUFFIXES)
    try:
        root = load(path)
    except ConfigError:
        if yaml_named:
            raise
        return "ansible-ini", text
    if isinstance(root, Mapping):
        keys = {k.text for k, _ in root.pairs if isinstance(k, Scalar)}
        if keys & {"hosts", "targets"}:
            return "gpuops", root
        if "all" in keys or any(_has_group_keys(v) for _, v in root.pairs):
            return "ansible-yaml", root
    if root is None or yaml_named:
        return "gpuops", root
    return "ansible-ini", text


def _has_group_keys(node: Node) -> bool:
    return isinstance(node, Mapping) and any(isinstance(k, Scalar) and k.text in GROUP_KEYS for k, _ in node.pairs)


@dataclass
class Var:
    """A variable's value (a YAML node, or a Python value from INI) and where it was written."""

    value: Any
    mark: Mark


@dataclass
class Group:
    name: str
    mark: Mark
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Var] = field(default_factory=dict)


class Tree:
    """Groups and hosts as the inventory file declares them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.groups: dict[str, Group] = {}
        self.hosts: dict[str, dict[str, Var]] = {}
        self.host_marks: dict[str, Mark] = {}
        self.group("all", Mark(path, 1, 1))

    def group(self, name: str, mark: Mark) -> Group:
        if not GROUP_NAME.match(name):
            raise ConfigError(mark, f"expected a group name (letters, digits, '_', '.', '-'), got {name!r}")
        return self.groups.setdefault(name, Group(name, mark))

    def add_host(self, group: Group, pattern: str, mark: Mark, variables: dict[str, Var]) -> None:
        for name in expand(pattern, mark):
            if not s.NAME.match(name):
                raise ConfigError(mark, f"expected a host name ({s.NAME_RULE}), got {name!r}")
            self.hosts.setdefault(name, {}).update(variables)
            self.host_marks.setdefault(name, mark)
            if name not in group.hosts:
                group.hosts.append(name)

    def add_child(self, parent: Group, name: str, mark: Mark) -> Group:
        child = self.group(name, mark)
        if name not in parent.children:
            parent.children.append(name)
        return child


def expand(pattern: str, mark: Mark) -> list[str]:
    """Ansible host ranges: db[01:03].lab -> db01.lab db02.lab db03.lab; [a:c] for letters; [0:9:2] steps."""
    found = _RANGE.search(pattern)
    if not found:
        return [pattern]
    head, tail = pattern[: found.start()], pattern[found.end() :]
    begin, end, step = found.group(1), found.group(2), int(found.group(3) or 1)
    if begin.isdigit() != end.isdigit() or step < 1:
        raise ConfigError(mark, f"bad host range [{found.group(0)[1:-1]}] (begin and end both numbers or both letters)")
    if begin.isdigit():
        width = len(begin) if begin.startswith("0") and len(begin) > 1 else 0
        if width and len(end) != width:
            raise ConfigError(mark, f"bad host range {found.group(0)}: zero-padded begin and end must be as long")
        values = [str(i).zfill(width) for i in range(int(begin), int(end) + 1, step)] if int(end) - int(begin) < MAX_RANGE * step else None
    else:
        values = [chr(c) for c in range(ord(begin), ord(end) + 1, step)]
    if values is None or not values:
        raise ConfigError(mark, f"bad host range {found.group(0)}: empty, or more than {MAX_RANGE} hosts")
    rests = expand(tail, mark)
    if len(values) * len(rests) > MAX_RANGE:
        raise ConfigError(mark, f"host pattern {pattern!r} expands to more than {MAX_RANGE} hosts")
    return [head + v + rest for v in values for rest in rests]


# -- YAML ---------------------------------------------------------------------------------------


def parse_yaml(root: Node, tree: Tree) -> None:
    """`all: {hosts, children, vars}`; other top-level groups are children of all."""
    for key, value in s.entries(root, "the inventory"):
        group = tree.group(key.text, key.mark)
        if group.name != "all":
            tree.add_child(tree.groups["all"], group.name, key.mark)
        _yaml_group(tree, group, value)


def _yaml_group(tree: Tree, group: Group, node: Node) -> None:
    if s.is_null(node):
        return
    sec = s.Section(node, f"group '{group.name}'", GROUP_KEYS)
    if (n := sec.get("vars")) is not None:
        group.vars.update(_yaml_vars(n, f"the vars of group '{group.name}'"))
    if (n := sec.get("hosts")) is not None:
        for key, value in s.entries(n, f"the hosts of group '{group.name}'"):
            variables = {} if s.is_null(value) else _yaml_vars(value, f"host '{key.text}'")
            tree.add_host(group, key.text, key.mark, variables)
    if (n := sec.get("children")) is not None:
        for key, value in s.entries(n, f"the children of group '{group.name}'"):
            _yaml_group(tree, tree.add_child(group, key.text, key.mark), value)


def _yaml_vars(node: Node, where: str) -> dict[str, Var]:
    return {key.text: Var(value, value.mark) for key, value in s.entries(node, where)}


def plain(value: Any) -> Any:
    """A variable as Python: YAML nodes read by the YAML 1.2 core schema, INI values as they are."""
    if isinstance(value, Mapping):
        return {k.text: plain(v) for k, v in s.entries(value, "a variable")}
    if isinstance(value, Sequence):
        return [plain(item) for item in value.items]
    if not isinstance(value, Scalar):
        return value
    kind = value.kind
    if kind == "null":
        return None
    if kind == "bool":
        return value.text.lower() == "true"
    if kind == "int" and len(value.text) <= 20:
        return int(value.text)
    return value.text


# -- INI ----------------------------------------------------------------------------------------


def parse_ini(path: str, text: str, tree: Tree) -> None:
    """[group] host lines with key=value, [group:vars] key=value, [group:children] group names."""
    group, kind = tree.group("ungrouped", Mark(path, 1, 1)), "hosts"
    for number, raw in enumerate(text.split("\n"), 1):
        raw = raw.rstrip("\r")
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        mark = Mark(path, number, len(raw) - len(raw.lstrip()) + 1)
        if line.startswith("["):
            found = _SECTION.match(line)
            if not found:
                raise ConfigError(mark, "expected a section header: [group], [group:vars] or [group:children]")
            kind = found.group(2) or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise ConfigError(mark, f"unknown section [{found.group(1)}:{kind}] (expected :vars or :children)")
            group = tree.group(found.group(1), mark)
        elif kind == "hosts":
            _ini_host(tree, group, raw, mark)
        elif kind == "children":
            tree.add_child(group, line.split()[0], mark)
        else:
            key, eq, value = raw.partition("=")
            if not eq or not key.strip():
                raise ConfigError(mark, f"expected key=value in [{group.name}:vars], got {line!r}")
            column = len(key) + 2 + len(value) - len(value.lstrip())
            group.vars[key.strip()] = Var(_literal(value.strip()), Mark(path, number, column))


def _ini_host(tree: Tree, group: Group, raw: str, mark: Mark) -> None:
    try:
        tokens = shlex.split(raw, comments=True)
    except ValueError as exc:
        raise ConfigError(mark, f"cannot read the host line: {exc} (check its quotes)") from None
    if not tokens:
        return
    pattern, *pairs = tokens
    name, _, port = pattern.rpartition(":")
    if not (name and port.isdigit() and ":" not in name.replace("[", "").split("]")[-1]):
        name, port = pattern, ""
    variables: dict[str, Var] = {}
    pos = raw.find(pattern) + len(pattern)
    for token in pairs:
        key, eq, value = token.partition("=")
        at = raw.find(key + "=" if eq and key else token, pos)
        where = Mark(mark.file, mark.line, at + 1) if at >= 0 else mark
        if not eq or not key:
            raise ConfigError(where, f"expected key=value after the host name, got {token!r}")
        variables[key] = Var(_literal(value), Mark(mark.file, mark.line, where.column + len(key) + 1))
        pos = max(pos, at + len(key) + 1)
    if port:
        variables.setdefault("ansible_port", Var(int(port), mark))
    tree.add_host(group, name, mark, variables)


def _literal(value: str) -> Any:
    """An INI value as Ansible reads it: a Python literal where it is one (200, [0, 1]), else the text."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


# -- variables, the Ansible way -----------------------------------------------------------------


class Layers:
    """Each host's variables: groups by depth (child over parent), group_vars/, the host, host_vars/."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.base = os.path.dirname(os.path.abspath(tree.path))
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
        value = plain(prio.value) if prio else 1
        return self.depth[group], value if isinstance(value, int) else 1, group

    def file_vars(self, folder: str, name: str) -> dict[str, Var]:
        """group_vars/<group>[.yml|.yaml|.json] and the files of a group_vars/<group>/ folder, beside the inventory."""
        if (folder, name) not in self._files:
            base = os.path.join(self.base, folder, name)
            paths = [base + ext for ext in VARS_SUFFIXES if os.path.isfile(base + ext)]
            if os.path.isdir(base):
                paths += [os.path.join(base, f) for f in sorted(os.listdir(base))
                          if not f.startswith(".") and os.path.splitext(f)[1] in VARS_SUFFIXES
                          and os.path.isfile(os.path.join(base, f))]
            out: dict[str, Var] = {}
            for path in paths:
                root = load(path)
                if root is not None:
                    out.update(_yaml_vars(root, f"the variables in {path}"))
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


def reconcile(tree: Tree) -> None:
    """As Ansible does: groups without a parent belong to all; hosts in no group are in ungrouped."""
    top = tree.groups["all"]
    ungrouped = tree.add_child(top, "ungrouped", top.mark)
    children = {c for g in tree.groups.values() for c in g.children}
    for name in list(tree.groups):
        if name != "all" and name not in children:
            tree.add_child(top, name, tree.groups[name].mark)
    grouped = {h for g in tree.groups.values() if g.name not in ("all", "ungrouped") for h in g.hosts}
    for host in tree.hosts:
        if host not in grouped and host not in ungrouped.hosts:
            ungrouped.hosts.append(host)


def load_ansible(path: str, kind: str, content: Any) -> Inventory:
    """An Ansible inventory (sniff's kind and what it read) as hosts, targets and groups."""
    from gpuops.config.ansible_hosts import HostBuilder

    tree = Tree(path)
    if kind == "ansible-yaml":
        parse_yaml(content, tree)
    else:
        parse_ini(path, content, tree)
    reconcile(tree)
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
    return Inventory(path=os.path.abspath(path), hosts=MappingProxyType(dict(builder.hosts)),
                     targets=MappingProxyType(targets), groups=MappingProxyType(groups))
