"""Typed readers over YAML nodes: each returns a plain value or raises ConfigError at the node.

The checks under them (a range, a pattern, a choice, no NUL, no GPU twice) take a plain value, so the
Ansible inventory's variables (gpuops.config.ansible.tree.Var) read through the same ones, word for word."""

from __future__ import annotations

import math
import re
from typing import Callable, Iterable
from typing import Sequence as Seq

from gpuops.config.yamlpos import Mapping, Node, Scalar, Sequence
from gpuops.config.yamlpos import describe as describe  # s.describe, for every section reader
from gpuops.errors import ConfigError
from gpuops.position import Mark

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
NAME_RULE = "letters, digits, '_', '.' and '-', starting with a letter or digit"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
CTID_MIN, CTID_MAX = 100, 999_999_999  # what Proxmox accepts as a container id
PORT_MIN, PORT_MAX = 1, 65535

# An address or user name goes into ssh's argv and config: no spaces, no leading '-'.
ADDRESS = re.compile(r"[^\s@/\\'\"`$;|&<>()-][^\s@/\\'\"`$;|&<>()]*\Z")
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


# -- the checks every reader shares: a plain value, where it was written, and how to show it -----


def in_range(value: int | None, low: int, high: int | None, what: str | None, mark: Mark,
             got: Callable[[], str]) -> int:
    """value when it is an integer within [low, high]; the message states the range."""
    if value is not None and value >= low and (high is None or value <= high):
        return value
    expected = f"an integer {low}..{high}" if high is not None else f"an integer >= {low}"
    if what:
        expected = f"{what} ({expected})"
    raise ConfigError(mark, f"expected {expected}, got {got()}")


def matching(value: str, pattern: re.Pattern[str], what: str, mark: Mark, got: Callable[[], str]) -> str:
    """value when pattern matches it (an address, a user name)."""
    if not pattern.match(value):
        raise ConfigError(mark, f"expected {what}, got {got()}")
    return value


def one_of(value: str | None, options: Seq[str], what: str, mark: Mark, got: Callable[[], str]) -> str:
    """value when it is one of options; the message lists them."""
    if value is not None and value in options:
        return value
    raise ConfigError(mark, f"expected {what}: {' | '.join(options)}, got {got()}")


def without_nul(value: str, what: str, mark_at: Callable[[int], Mark]) -> str:
    """value when it holds no NUL (it goes into argv and files)."""
    if "\x00" in value:
        raise ConfigError(mark_at(value.index("\x00")), f"expected {what} without NUL characters")
    return value


def add_gpu(gpus: dict[int, None], gpu: int, mark: Mark, where: str = "") -> None:
    """One more GPU index of a list; one listed twice is refused."""
    if gpu in gpus:
        raise ConfigError(mark, f"GPU {gpu} is listed twice{where}")
    gpus[gpu] = None


# -- readers of YAML nodes ----------------------------------------------------------------------


def suggest(word: str, choices: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest choice, or ''."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def is_null(node: Node) -> bool:
    return isinstance(node, Scalar) and node.kind == "null"


def entries(node: Node, what: str) -> list[tuple[Scalar, Node]]:
    """The key/value pairs of a mapping, merge keys (<<) applied, a key given twice refused."""
    return _entries(node, what, frozenset(), {})


def _entries(
    node: Node, what: str, seen: frozenset[int], memo: dict[int, list[tuple[Scalar, Node]]]
) -> list[tuple[Scalar, Node]]:
    # memo: a mapping merged along many paths (a "merge bomb") is flattened once.
    if not isinstance(node, Mapping):
        raise ConfigError(node.mark, f"expected a mapping for {what}, got {describe(node)}")
    if id(node) in memo:
        return memo[id(node)]
    seen = seen | {id(node)}
    explicit: dict[str, Scalar] = {}
    inherited: dict[str, tuple[Scalar, Node]] = {}
    own: list[tuple[Scalar, Node]] = []
    for key, value in node.pairs:
        if _is_merge(key):
            for source in value.items if isinstance(value, Sequence) else [value]:
                if not isinstance(source, Mapping):
                    raise ConfigError(source.mark, f"expected a mapping to merge with '<<', got {describe(source)}")
                if id(source) in seen:
                    raise ConfigError(source.mark, "a mapping cannot merge itself with '<<'")
                for k, v in _entries(source, what, seen, memo):
                    inherited.setdefault(k.text, (k, v))
            continue
        if not isinstance(key, Scalar):
            raise ConfigError(key.mark, f"expected a plain key in {what}, got {describe(key)}")
        first = explicit.get(key.text)
        if first is not None:
            raise ConfigError(
                key.mark,
                f"duplicate key '{key.text}' in {what} (first given at line {first.mark.line}, "
                f"column {first.mark.column})",
            )
        explicit[key.text] = key
        own.append((key, value))
    memo[id(node)] = [pair for key_text, pair in inherited.items() if key_text not in explicit] + own
    return memo[id(node)]


def _is_merge(key: Node) -> bool:
    return isinstance(key, Scalar) and key.style is None and key.text == "<<"


class Section:
    """A mapping with a fixed set of keys: an unknown key is refused with the allowed ones listed."""

    def __init__(self, node: Node, where: str, keys: Seq[str]) -> None:
        allowed = ", ".join(sorted(keys))
        if not isinstance(node, Mapping):
            raise ConfigError(node.mark, f"expected a mapping for {where} (keys: {allowed}), got {describe(node)}")
        self.mark = node.mark
        self.where = where
        self._keys: dict[str, Scalar] = {}
        self._values: dict[str, Node] = {}
        for key, value in entries(node, where):
            if key.text not in keys:
                raise ConfigError(
                    key.mark,
                    f"unknown key '{key.text}' in {where} (expected one of: {allowed}){suggest(key.text, keys)}",
                )
            self._keys[key.text] = key
            self._values[key.text] = value

    def get(self, key: str) -> Node | None:
        """The value node, or None when the key is absent or null (its default applies)."""
        node = self._values.get(key)
        return None if node is None or is_null(node) else node

    def written(self, key: str) -> Node | None:
        """The value node as written, null included (None only when the key is absent)."""
        return self._values.get(key)

    def given(self, key: str) -> bool:
        return key in self._values

    def key_mark(self, key: str) -> Mark:
        return self._keys[key].mark

    def require(self, key: str, what: str) -> Node:
        node = self._values.get(key)
        if node is None:
            raise ConfigError(self.mark, f"missing key '{key}' in {self.where} ({what})")
        if is_null(node):
            raise ConfigError(node.mark, f"'{key}' in {self.where} has no value (expected {what})")
        return node


def text(node: Node, what: str = "a string") -> str:
    """A string; plain numbers count as written ("1e-4" stays "1e-4"); booleans and null do not."""
    if not isinstance(node, Scalar) or node.kind in ("null", "bool"):
        hint = " (quote it to use it as text)" if isinstance(node, Scalar) and node.kind == "bool" else ""
        raise ConfigError(node.mark, f"expected {what}, got {describe(node)}{hint}")
    return without_nul(node.text, what, node.mark_at)


def text_matching(node: Node, pattern: re.Pattern[str], what: str) -> str:
    """Text the pattern matches (an address, a user name)."""
    return matching(text(node, what), pattern, what, node.mark, lambda: describe(node))


def nonempty(node: Node, what: str) -> str:
    value = text(node, what)
    if not value.strip():
        raise ConfigError(node.mark, f"expected {what}, got an empty string")
    return value


def name(node: Node, what: str) -> str:
    """A host, target, rule or playbook name."""
    if isinstance(node, Scalar) and node.kind not in ("null",) and NAME.match(node.text):
        return node.text
    raise ConfigError(node.mark, f"expected {what} ({NAME_RULE}), got {describe(node)}")


def _quoted_number_hint(node: Node) -> str:
    if isinstance(node, Scalar) and node.style is not None and (node.text.strip() and _looks_numeric(node.text)):
        return " (a quoted string: remove the quotes)"
    return ""


def _looks_numeric(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def integer(node: Node, low: int, high: int | None = None, what: str | None = None) -> int:
    """An integer within [low, high]; the message states the range."""
    value = int(node.text) if isinstance(node, Scalar) and node.kind == "int" and len(node.text) <= 20 else None
    return in_range(value, low, high, what, node.mark, lambda: describe(node) + _quoted_number_hint(node))


def seconds(node: Node, *, zero_ok: bool, at_least: float | None = None) -> float:
    """A finite number of seconds, > 0 (or >= 0 where 0 means off, or >= at_least)."""
    bound = f">= {at_least:g}" if at_least is not None else ">= 0" if zero_ok else "> 0"
    if isinstance(node, Scalar) and node.kind in ("int", "float"):
        value = _finite(node.text)
        if value is not None and (value > 0 or (zero_ok and value == 0)) and value >= (at_least or 0):
            return value
    raise ConfigError(
        node.mark, f"expected a number of seconds {bound}, got {describe(node)}{_quoted_number_hint(node)}"
    )


def number(node: Node, what: str = "a number", *, above: float | None = None, below: float | None = None) -> float:
    """A finite number strictly between the bounds given; the message states them."""
    if isinstance(node, Scalar) and node.kind in ("int", "float"):
        value = _finite(node.text)
        if value is not None and (above is None or value > above) and (below is None or value < below):
            return value
    bounds = " and ".join(f"{op} {bound:g}" for op, bound in ((">", above), ("<", below)) if bound is not None)
    raise ConfigError(node.mark, f"expected {what} {bounds}, got {describe(node)}{_quoted_number_hint(node)}")


def _finite(number: str) -> float | None:
    """The float a YAML number means, or None for .inf, .nan and overflows."""
    try:
        value = float(number) if len(number) <= 40 else math.inf
    except ValueError:  # .inf / .nan spellings
        return None
    return value if math.isfinite(value) else None


def boolean(node: Node) -> bool:
    """true or false, nothing else: 'yes', 'on' and 1 are refused."""
    if isinstance(node, Scalar) and node.kind == "bool":
        return node.text.lower() == "true"
    raise ConfigError(node.mark, f"expected true or false, got {describe(node)}")


def choice(node: Node, options: Seq[str], what: str) -> str:
    value = node.text if isinstance(node, Scalar) and node.kind == "str" else None
    return one_of(value, options, what, node.mark,
                  lambda: describe(node) + (suggest(node.text, options) if isinstance(node, Scalar) else ""))


def items(node: Node, what: str) -> list[Node]:
    if not isinstance(node, Sequence):
        raise ConfigError(node.mark, f"expected a list of {what}, got {describe(node)}")
    return node.items


def distinct_names(node: Node, what: str, known: Seq[str], key: str, is_no: str) -> tuple[str, ...]:
    """A list of distinct names, each one of `known`, in the order given. `key` names the list in messages
    ("restart.on"), `is_no` what a name outside `known` is not ("is no event")."""
    out: dict[str, None] = {}
    for item in items(node, what):
        name = item.text if isinstance(item, Scalar) and item.kind == "str" else None
        if name is None or name not in known:
            got = f"'{name}'" if name is not None else describe(item)
            raise ConfigError(item.mark, f"{key}: {got} {is_no}; expected one of {', '.join(known)}"
                                         f"{suggest(name or '', known)}")
        if name in out:
            raise ConfigError(item.mark, f"{key} lists '{name}' twice")
        out[name] = None
    return tuple(out)


def gpu_list(node: Node) -> tuple[int, ...]:
    """Distinct GPU indexes, in the order given."""
    gpus: dict[int, None] = {}
    for item in items(node, "GPU indexes (e.g. [0, 1])"):
        add_gpu(gpus, integer(item, 0, what="a GPU index"), item.mark)
    return tuple(gpus)
