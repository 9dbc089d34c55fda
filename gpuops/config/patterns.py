"""Ansible host patterns for -t, resolved as Ansible's inventory manager resolves them: `a:b` / `a,b`
(union), `a:&b` (and in b), `a:!b` (not in b), wildcards (`ct20*`) and `~regex` over hosts and groups."""

from __future__ import annotations

import fnmatch
import re

from gpuops.errors import UsageError
from gpuops.targets import Inventory

_SPECIAL = set(":,!&*?[~")


def is_pattern(text: str) -> bool:
    """Whether -t's value is a pattern rather than one target or group name."""
    return any(c in _SPECIAL for c in text)


def split(pattern: str) -> list[str]:
    """`a,b` or `a:b` -> [a, b] (Ansible splits on commas when there are any, else on colons)."""
    parts = pattern.split(",") if "," in pattern else pattern.split(":")
    return [p.strip() for p in parts if p.strip()]


def select(inventory: Inventory, pattern: str) -> list[str]:
    """The names the pattern selects, in inventory order: the plain terms' union, then each `&` term
    intersected, then each `!` term removed (Ansible's order, whatever order they are written in)."""
    terms = split(pattern)
    plain = [t for t in terms if t[0] not in "!&"]
    ands = [t[1:] for t in terms if t[0] == "&"]
    nots = [t[1:] for t in terms if t[0] == "!"]
    order = [*inventory.targets, *(b for b in inventory.broken if b not in inventory.targets)]
    chosen: set[str] = set()
    for term in plain or ["all"]:
        chosen |= _matches(inventory, term, order)
    for term in ands:
        chosen &= _matches(inventory, term, order)
    for term in nots:
        chosen -= _matches(inventory, term, order)
    return [name for name in order if name in chosen]


def _matches(inventory: Inventory, term: str, order: list[str]) -> set[str]:
    """A term's hosts: a group's or host's exact name, else wildcard / ~regex matches of groups and hosts."""
    if not term:
        raise UsageError("empty term in the host pattern")
    if term in ("all", "*"):
        return set(order)
    if term in inventory.groups:
        return set(inventory.groups[term])
    if term in order:
        return {term}
    if term.startswith("~"):
        try:
            regex = re.compile(term[1:])
        except re.error as exc:
            raise UsageError(f"host pattern {term!r}: not a regular expression ({exc})") from None
    else:
        regex = re.compile(fnmatch.translate(term))
    found = {name for group, members in inventory.groups.items() if regex.match(group) for name in members}
    return found | {name for name in order if regex.match(name)}
