"""A log line's text as the rules see it (decoded, escape sequences removed) and the bounded
excerpts a hit carries."""

from __future__ import annotations

import re
from collections import deque
from typing import Callable, Sequence

#: Excerpt bounds: lines, characters per line, characters in all.
EXCERPT_LINES = 40
EXCERPT_LINE_CHARS = 1000
EXCERPT_CHARS = 8192

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\r\n]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def _same(text: str) -> str:
    return text


def _clean(raw: bytes) -> str:
    """Decode a raw line (invalid UTF-8 replaced) and remove ANSI escape sequences."""
    text = raw.decode("utf-8", "replace")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text


def _shorten(text: str) -> str:
    if len(text) <= EXCERPT_LINE_CHARS:
        return text
    return text[: EXCERPT_LINE_CHARS - 3] + "..."


def _excerpt(head: list[str], tail: Sequence[str], dropped: int) -> str:
    """Join excerpt lines, bounded to EXCERPT_LINES lines and EXCERPT_CHARS characters."""
    lines = list(head)
    if dropped:
        lines.append(f"... ({dropped} lines not shown) ...")
    lines.extend(tail)
    text = "\n".join(lines)
    while len(text) > EXCERPT_CHARS and len(lines) > 2:
        del lines[len(lines) // 2]
        text = "\n".join(lines)
    return text[:EXCERPT_CHARS]


class _Lines:
    """Excerpt lines: the first few and the last many, with a count of those between."""

    HEAD = 6

    def __init__(self, short: Callable[[str], str]) -> None:
        self.short = short  # masks secrets, then shortens: a cut never shows part of a secret
        self.head: list[str] = []
        self.tail: deque[str] = deque(maxlen=EXCERPT_LINES - self.HEAD - 1)
        self.dropped = 0

    def add(self, text: str) -> None:
        text = self.short(text)
        if len(self.head) < self.HEAD:
            self.head.append(text)
            return
        if len(self.tail) == self.tail.maxlen:
            self.dropped += 1
        self.tail.append(text)

    def join(self) -> str:
        return _excerpt(self.head, self.tail, self.dropped)
