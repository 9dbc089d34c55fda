"""Groups, hosts and their variables as an Ansible inventory file declares them (before any layering).

A variable is a Var: its value (a YAML node, or a Python value from INI) and where it was written;
its typed readers go through schema.py's checks, so both inventory formats word their errors alike.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from gpuops.config import schema as s
from gpuops.config.yamlpos import Mapping, Node, Scalar, Sequence
from gpuops.errors import ConfigError
from gpuops.position import Mark

GROUP_KEYS = ("children", "hosts", "vars")
MAX_RANGE = 10_000  # hosts one pattern such as node[001:999] may expand to
GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_RANGE = re.compile(r"\[([0-9]+|[a-zA-Z]):([0-9]+|[a-zA-Z])(?::([0-9]+))?\]")


@dataclass
class Var:
    """A variable's value (a YAML node, or a Python value from INI) and where it was written."""

    value: Any
    mark: Mark
    name: str = ""  # the variable's name (ansible_host): what an error about its value shows

    def plain(self) -> Any:
        return plain(self.value)

    def mark_at(self, offset: int) -> Mark:
        """Where the value's character at `offset` was written (exact on one line)."""
        if isinstance(self.value, Scalar):
            return self.value.mark_at(offset)
        return Mark(self.mark.file, self.mark.line, self.mark.column + offset)

    def text(self, what: str) -> str:
        """Text (a number counts as written); a Jinja template is refused: gpuops does not evaluate them."""
        self._not_vaulted(what)
        value = self.plain()
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(self.mark, f"expected {what}, got {show(value)}")
        self._one_reading(str, what)
        value = str(value)
        if "{{" in value or "{%" in value:
            raise TemplateValue(self.mark, f"expected {what}, got the Jinja template {show(value)}: gpuops does not "
                                           "evaluate templates; write the value itself (a host_vars/ or group_vars/ "
                                           "file may hold it), or give -i the JSON of `ansible-inventory --list`")
        return s.without_nul(value, what, lambda _: self.mark)

    def vaulted(self) -> bool:
        """An Ansible Vault value: `!vault |` in YAML, or the {"__ansible_vault": ...} that ansible-inventory
        --list prints for a value it could not decrypt (or its $ANSIBLE_VAULT; text)."""
        node = self.value
        if isinstance(node, Scalar):
            return node.tag == VAULT_TAG or node.text.lstrip().startswith(VAULT_HEADER)
        if isinstance(node, Mapping):
            return [k.text for k, _ in node.pairs if isinstance(k, Scalar)] == [VAULT_KEY]
        return isinstance(node, str) and node.lstrip().startswith(VAULT_HEADER)

    def _not_vaulted(self, what: str) -> None:
        if self.vaulted():
            raise VaultedValue(self.mark, what, self.name)

    def _one_reading(self, as_used: Any, what: str) -> None:
        """A plain YAML scalar that Ansible (YAML 1.1) and a YAML 1.2 reader read differently is refused:
        `0201` is 129 to Ansible and 201 to YAML 1.2, `22_22` 2222 and text, `yes` true and text."""
        node = self.value
        if not isinstance(node, Scalar) or node.style is not None or node.tag is not None:
            return
        ansible = yaml11(node.text)
        if ansible is _NO_READING:
            return
        ours = plain(node)
        if as_used is str:
            same = isinstance(ansible, str) or (not isinstance(ansible, bool) and str(ansible) == str(ours))
            same = same and not isinstance(ours, bool)
        else:
            same = type(ansible) is type(ours) and ansible == ours or (
                isinstance(ansible, str) and _int_like(ansible) == ours and not isinstance(ours, bool))
        if not same:
            raise ConfigError(self.mark, f"{node.text} is ambiguous as {what}: Ansible (YAML 1.1) reads it as "
                                         f"{ansible!r}, a YAML 1.2 reader as {ours!r}; write the value Ansible "
                                         f"uses unambiguously, or quote it to mean the text {node.text!r}")

    def matching(self, pattern: re.Pattern[str], what: str) -> str:
        value = self.text(what)
        return s.matching(value, pattern, what, self.mark, lambda: show(value))

    def choice(self, options: tuple[str, ...], what: str) -> str:
        value = self.text(what)
        return s.one_of(value, options, what, self.mark, lambda: show(value))

    def integer(self, low: int, high: int, what: str) -> int:
        """An integer, or text of digits (INI values are often text)."""
        self._not_vaulted(what)
        value = self.plain()
        self._one_reading(int, what)
        return s.in_range(_int_like(value), low, high, what, self.mark, lambda: show(value))

    def gpus(self) -> tuple[int, ...]:
        """gpuops_gpus: a list [0, 1], or text '0,1' / '[0, 1]' (INI :vars values are text), or one index."""
        self._not_vaulted("GPU indexes")
        value = self.plain()
        if isinstance(value, str):
            items: list[Any] = [x.strip() for x in value.strip().strip("[]()").split(",") if x.strip()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            items = [value]
        gpus: dict[int, None] = {}
        for item in items:
            gpu = _int_like(item)
            if gpu is None or gpu < 0:
                raise ConfigError(self.mark, f"expected GPU indexes (e.g. [0, 1]) in gpuops_gpus, got {show(item)}")
            s.add_gpu(gpus, gpu, self.mark, " in gpuops_gpus")
        return tuple(gpus)


    def boolean(self, what: str) -> bool:
        """A boolean as Ansible's `boolean()` reads it: yes/no, on/off, true/false, 1/0, y/n, t/f (any case)."""
        self._not_vaulted(what)
        value = self.plain()
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            self.text(what)  # the template error
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        word = value.strip().lower() if isinstance(value, str) else None
        if word in ("yes", "on", "1", "true", "y", "t"):
            return True
        if word in ("no", "off", "0", "false", "n", "f"):
            return False
        raise ConfigError(self.mark, f"expected {what} (true or false, as Ansible reads yes/no, 1/0), got {show(value)}")


class HostValueError(ConfigError):
    """A value gpuops cannot use in one host's variables: it fails only the targets that use it, when used."""


class TemplateValue(HostValueError):
    """A Jinja template where gpuops needs a value."""


class VaultedValue(HostValueError):
    """An Ansible Vault value where gpuops needs the value: gpuops does not decrypt vault; the way out.
    (`ansible-inventory --list` does not decrypt either: it prints {"__ansible_vault": ...} for each one.)"""

    def __init__(self, mark: Mark, what: str, variable: str, inventory: str = "INVENTORY", host: str = "HOST") -> None:
        import shlex

        shown = f"`ansible -i {shlex.quote(inventory)} {shlex.quote(host)} -m debug -a var={variable or 'VARIABLE'} " \
                "--vault-password-file FILE`"
        super().__init__(mark, f"expected {what}, got an Ansible Vault value (!vault): gpuops does not decrypt vault; "
                               "write this value in plain text (or in ~/.ssh/config) where gpuops reads it; "
                               f"{shown} shows it")
        self.what, self.variable = what, variable

    def in_inventory(self, inventory: str, host: str) -> "VaultedValue":
        """The same error, its way out naming the inventory the user gave and the host."""
        assert self.mark is not None
        return VaultedValue(self.mark, self.what, self.variable, inventory, host)


VAULT_TAG = "!vault"
VAULT_HEADER = "$ANSIBLE_VAULT;"
VAULT_KEY = "__ansible_vault"  # what ansible-inventory --list prints for a value it could not decrypt


_NO_READING = object()


def yaml11(text: str) -> Any:
    """A plain scalar as PyYAML (YAML 1.1, what Ansible reads with) reads it; _NO_READING when it cannot."""
    import yaml

    try:
        tag = yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
        node = yaml.ScalarNode(tag, text)
        return yaml.SafeLoader("").construct_object(node, deep=True)
    except Exception:  # any reading PyYAML cannot make is no second reading
        return _NO_READING


def first_set(v: dict[str, Var], *names: str) -> Var | None:
    """The first of `names` set to something other than null."""
    for name in names:
        var = v.get(name)
        if var is not None and var.plain() is not None:
            return var
    return None


def show(value: Any) -> str:
    """How an error message shows a variable's value: 'abc', 70000, a list."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    return str(value)


def _int_like(value: Any) -> int | None:
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 18:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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


def yaml_vars(node: Node, where: str) -> dict[str, Var]:
    """The variables of a YAML mapping (a host's, a group's vars:, a group_vars/ file)."""
    return {key.text: Var(value, value.mark, key.text) for key, value in s.entries(node, where)}


@dataclass
class Group:
    name: str
    mark: Mark
    hosts: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    vars: dict[str, Var] = field(default_factory=dict)


class Tree:
    """Groups and hosts as the inventory file declares them."""

    def __init__(self, path: str, *, base: str | None = None, var_files: bool = True) -> None:
        self.path = path
        self.base = base or os.path.dirname(os.path.abspath(path))  # where group_vars/ and host_vars/ are
        self.var_files = var_files  # False where Ansible already applied them (ansible-inventory --list)
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

    def reconcile(self) -> None:
        """As Ansible does: groups without a parent belong to all; hosts in no group are in ungrouped."""
        top = self.groups["all"]
        ungrouped = self.add_child(top, "ungrouped", top.mark)
        children = {c for g in self.groups.values() for c in g.children}
        for name in list(self.groups):
            if name != "all" and name not in children:
                self.add_child(top, name, self.groups[name].mark)
        grouped = {h for g in self.groups.values() if g.name not in ("all", "ungrouped") for h in g.hosts}
        for host in self.hosts:
            if host not in grouped and host not in ungrouped.hosts:
                ungrouped.hosts.append(host)


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
