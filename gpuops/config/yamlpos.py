"""YAML text -> a tree of nodes that keep their file:line:col, built from the parser's events.

We compose the tree ourselves instead of calling yaml.compose: libyaml's composer recurses in
C and crashes the interpreter on deeply nested input, and we want the YAML 1.2 core reading of
plain scalars (only true/false are booleans; "yes", "on" and "0200" stay what they look like).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Iterator, Union

from gpuops.errors import ConfigError, UsageError
from gpuops.position import Mark

MAX_DEPTH = 64  # far beyond any real inventory or playbook; guards against hostile nesting
MAX_BYTES = 1 << 20  # 1 MiB: real files are a few KiB; bounds what a device such as /dev/zero can make us hold
_ONCE: dict[str, str] = {}  # what a pipe gave (`-p <(...)`, /dev/stdin): it cannot be read a second time

_STD = "tag:yaml.org,2002:"
_TAGS = {"str", "int", "float", "bool", "null", "map", "seq", "merge"}

# The characters YAML refuses in a stream (YAML 1.1, 5.1), checked here for an exact line:col;
# written as the refused set because the complement of the allowed set compiles 20x slower.
_NON_PRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")

# YAML 1.2 core schema for plain scalars.
_NULL = re.compile(r"(?:~|null|Null|NULL|)\Z")
_BOOL = re.compile(r"(?:true|True|TRUE|false|False|FALSE)\Z")
_INT = re.compile(r"[-+]?[0-9]+\Z")
_FLOAT = re.compile(
    r"(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)


class Node:
    """A YAML node and where it starts."""

    __slots__ = ("mark",)

    def __init__(self, mark: Mark) -> None:
        self.mark = mark


class Scalar(Node):
    """A scalar as written: its text, its quoting style (None when plain), an explicit tag."""

    __slots__ = ("text", "style", "tag", "end", "source")

    def __init__(self, mark: Mark, text: str, style: str | None, tag: str | None, end: Mark, source: str) -> None:
        super().__init__(mark)
        self.text = text
        self.style = style
        self.tag = tag
        self.end = end
        self.source = source  # the scalar's raw text when it sits on one line, else ""

    @property
    def kind(self) -> str:
        """null | bool | int | float | str, read by the YAML 1.2 core schema."""
        if self.tag == _STD + "str" or self.tag == "!" or self.style is not None:
            return "str"
        for kind, pattern in (("null", _NULL), ("bool", _BOOL), ("int", _INT), ("float", _FLOAT)):
            if pattern.match(self.text):
                return kind
        return "str"

    def mark_at(self, offset: int) -> Mark:
        """The mark of the character at offset in the value, exact where the source shows it one to one."""
        raw = self.source
        if self.style in ("'", '"'):
            raw = raw[1:-1]
            shift = 1
        else:
            shift = 0
        if raw != self.text or not 0 <= offset <= len(raw):
            return self.mark
        return Mark(self.mark.file, self.mark.line, self.mark.column + shift + offset)


class Sequence(Node):
    __slots__ = ("items",)

    def __init__(self, mark: Mark) -> None:
        super().__init__(mark)
        self.items: list[Node] = []


class Mapping(Node):
    __slots__ = ("pairs",)

    def __init__(self, mark: Mark) -> None:
        super().__init__(mark)
        self.pairs: list[tuple[Node, Node]] = []


AnyNode = Union[Scalar, Sequence, Mapping]


def describe(node: Node) -> str:
    """How an error message shows a value the user wrote: 'abc', 70000, a list, nothing."""
    if isinstance(node, Mapping):
        return "a mapping"
    if isinstance(node, Sequence):
        return "a list"
    assert isinstance(node, Scalar)
    kind = node.kind
    text = node.text if len(node.text) <= 60 else node.text[:57] + "..."
    if kind == "null":
        return "nothing" if text == "" else text
    return text if kind in ("bool", "int", "float") else repr(text)


def read_text(path: str) -> str:
    """The file's text; a missing, unreadable, oversized or non-UTF-8 file is a clear error.

    At most MAX_BYTES are read, so /dev/stdin and `<(...)` pipes work and /dev/zero does not fill memory;
    a pipe's text is kept, so a second reader of the same path (a format sniffer) gets it too.
    """
    if path in _ONCE:
        return _ONCE[path]
    try:
        with open(path, "rb") as f:
            once = not stat.S_ISREG(os.fstat(f.fileno()).st_mode)
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, expected a YAML file") from None
    except PermissionError:
        raise UsageError(f"{path}: cannot read the file: permission denied") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path; OSError: also a device that fails reads
        where = path if path.isprintable() else repr(path)
        raise UsageError(f"{where}: cannot read the file: {getattr(exc, 'strerror', None) or exc}") from None
    if len(data) > MAX_BYTES:
        raise UsageError(
            f"{path}: larger than 1 MiB; an inventory or playbook is a few KiB (is this the right file?)"
        )
    text = _decode(path, data)
    if once:
        _ONCE[path] = text
    return text


def _decode(path: str, data: bytes) -> str:
    """UTF-8 text YAML accepts, or a ConfigError at the first byte or character it does not."""
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark: editors do not count it
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        column = len(data[line_start : exc.start].decode("utf-8", "replace")) + 1
        byte = data[exc.start]
        raise ConfigError(
            Mark(path, line, column), f"not valid UTF-8 (byte 0x{byte:02x}); save the file as UTF-8"
        ) from None
    bad = _NON_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        raise ConfigError(
            Mark(path, line, column),
            f"character U+{ord(bad.group()):04X} is not allowed in a YAML file "
            f'(in a double-quoted string, write it as "\\u{ord(bad.group()):04X}")',
        )
    return text


VAULT_TAG = "!vault"  # Ansible Vault: kept (as a tagged scalar) only where vault=True, for Ansible's own files
NO_VAULT = ("an Ansible Vault value (!vault) in a gpuops file: gpuops does not decrypt vault; write the value "
            "itself, or (in a playbook's env) take it from the environment with from_env")


def load(path: str, *, vault: bool = False) -> AnyNode | None:
    """The file's single YAML document as a node tree, or None when it holds nothing (or null).
    vault: keep `!vault` scalars (an Ansible file: an error only where gpuops uses the value)."""
    text = read_text(path)
    import yaml  # here, not at import time: `gpuops validate` must start fast

    loader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
    try:
        root = _Composer(path, text, yaml.parse(text, Loader=loader), vault=vault).document()
        return None if isinstance(root, Scalar) and root.kind == "null" else root
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(path, text, exc) from None
    except yaml.YAMLError as exc:
        raise ConfigError(Mark(path, 1, 1), f"cannot parse the file: {exc}") from None


def first_vault(root: Node | None) -> Scalar | None:
    """The first `!vault` scalar in a tree (a gpuops file read with vault=True refuses it); each node once,
    so aliases (a billion laughs, an anchor inside itself) cost no more than the file's own nodes."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Scalar):
            if node.tag == VAULT_TAG:
                return node
        elif isinstance(node, Sequence):
            todo.extend(reversed(node.items))
        elif isinstance(node, Mapping):
            todo.extend(n for kv in reversed(node.pairs) for n in reversed(kv))
    return None


def _syntax_error(path: str, text: str, exc: Any) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    if mark is None:
        return ConfigError(Mark(path, 1, 1), str(exc.problem or exc.context or "invalid YAML"))
    problem = str(exc.problem or "invalid YAML")
    lines = text.split("\n")
    if "cannot start any token" in problem and mark.line < len(lines):
        line = lines[mark.line]
        if mark.column < len(line) and line[mark.column] == "\t":
            problem = "found a tab character where YAML expects spaces; indent with spaces"
    message = problem
    ctx = exc.context_mark
    if exc.context and ctx is not None and (ctx.line, ctx.column) != (mark.line, mark.column):
        message += f" ({exc.context} started at line {ctx.line + 1}, column {ctx.column + 1})"
    return ConfigError(Mark(path, mark.line + 1, mark.column + 1), message)


class _Composer:
    """Builds nodes from parser events; aliases share their anchor's node."""

    def __init__(self, path: str, text: str, events: Iterator[Any], *, vault: bool = False) -> None:
        self.path = path
        self.vault = vault
        self.lines = text.split("\n")
        self.events = events
        self.anchors: dict[str, Node] = {}

    def mark(self, m: Any) -> Mark:
        return Mark(self.path, m.line + 1, m.column + 1)

    def document(self) -> AnyNode | None:
        root: AnyNode | None = None
        documents = 0
        for event in self.events:
            name = type(event).__name__
            if name == "DocumentStartEvent":
                documents += 1
                if documents > 1:
                    raise ConfigError(
                        self.mark(event.start_mark),
                        "expected a single YAML document, found a second one (remove the '---')",
                    )
                self.anchors = {}
            elif name not in ("StreamStartEvent", "StreamEndEvent", "DocumentEndEvent"):
                root = self.node(event, 1)
        return root

    def node(self, event: Any, depth: int) -> AnyNode:
        name = type(event).__name__
        mark = self.mark(event.start_mark)
        if name == "AliasEvent":
            if event.anchor not in self.anchors:
                raise ConfigError(mark, f"unknown alias '*{event.anchor}' (no anchor '&{event.anchor}' before it)")
            return self.anchors[event.anchor]  # type: ignore[return-value]
        if depth > MAX_DEPTH:
            raise ConfigError(mark, f"nested more than {MAX_DEPTH} levels deep")
        tag = event.tag
        if tag == VAULT_TAG and not (self.vault and name == "ScalarEvent"):
            raise ConfigError(mark, NO_VAULT if not self.vault else "expected the text of a vaulted value after !vault")
        if tag is not None and tag != "!" and tag != VAULT_TAG and not (tag.startswith(_STD) and tag[len(_STD) :] in _TAGS):
            raise ConfigError(
                mark, f"unsupported tag '{tag}' (use plain strings, numbers, true/false, lists and mappings)"
            )
        node: AnyNode
        if name == "ScalarEvent":
            node = self.scalar(event, mark, tag)
            self.anchor(event, node)
        elif name == "SequenceStartEvent":
            node = Sequence(mark)
            self.anchor(event, node)
            for child in self.children("SequenceEndEvent"):
                node.items.append(self.node(child, depth + 1))
        else:
            node = Mapping(mark)
            self.anchor(event, node)
            children = self.children("MappingEndEvent")
            for key in children:
                key_node = self.node(key, depth + 1)
                node.pairs.append((key_node, self.node(next(children), depth + 1)))
        return node

    def children(self, end: str) -> Iterator[Any]:
        for event in self.events:
            if type(event).__name__ == end:
                return
            yield event

    def anchor(self, event: Any, node: Node) -> None:
        if event.anchor is not None:
            self.anchors[event.anchor] = node

    def scalar(self, event: Any, mark: Mark, tag: str | None) -> Scalar:
        start, end = event.start_mark, event.end_mark
        source = ""
        if start.line == end.line and start.line < len(self.lines):
            source = self.lines[start.line][start.column : end.column]
        style = event.style or None
        return Scalar(mark, event.value, style, tag, self.mark(end), source)
