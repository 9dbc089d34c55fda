"""The Ansible INI inventory plugin: [group] host lines with key=value, [group:vars], [group:children]."""

from __future__ import annotations

import ast
import re
import shlex
from typing import Any

from gpuops.config.ansible.build import inventory_of
from gpuops.config.ansible.tree import Group, Tree, Var
from gpuops.config.source import Source
from gpuops.errors import ConfigError
from gpuops.position import Mark
from gpuops.targets import Inventory

_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:[#;].*)?\Z")


def accepts(source: Source) -> bool:
    """Any file not named as YAML: INI is the format asked last, when no YAML format took the file."""
    return not source.yaml_named


def load(source: Source) -> Inventory:
    tree = Tree(source.path)
    parse_ini(source.path, source.text, tree)
    return inventory_of(tree)


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
            group.vars[key.strip()] = Var(_literal(value.strip()), Mark(path, number, column), key.strip())


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
        variables[key] = Var(_literal(value), Mark(mark.file, mark.line, where.column + len(key) + 1), key)
        pos = max(pos, at + len(key) + 1)
    if port:
        variables.setdefault("ansible_port", Var(int(port), mark, "ansible_port"))
    tree.add_host(group, name, mark, variables)


def _literal(value: str) -> Any:
    """An INI value as Ansible reads it: a Python literal where it is one (200, [0, 1]), else the text."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value
