"""The fast path: which lines of a chunk can match, found with C-speed primitives.

Most of a training log matches nothing, so the matcher works on whole chunks. One
``bytes.translate`` pass per chunk keeps only line ends, escape bytes and a few more
(``Matcher._survey``): the line count comes from what it kept (the count must cover every
byte: a later hit's number depends on it), and so does whether the chunk holds an escape
sequence or a trigger literal's anchor, a byte of it that is rare in this log (measured on a
sample). Literals without a rare byte are found with ``bytes.find`` (a regex for literals
sharing a prefix), or by a ``prefilter`` such as hyperscan's (``gpuops.client.accel``).
Only lines holding a trigger or an escape sequence, and every line while a traceback or a
wait is open, are decoded and matched one by one, by the same code that would match every
line; the result is identical either way (tests compare the two). A rule whose regex has no
literal text is searched in every line of the decoded chunk, several times slower.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

from .budget import Guard
from .literals import _required_literals
from .rules import _UNTRUSTED, Rule
from .text import _ANSI
from .tracebacks import _TB_TRIGGER

#: Lines the matcher remembers: a traceback header's context, waits replayed after skipped lines.
_RECENT = 8

#: ``Matcher(prefilter=...)``: called with trigger literals grouped in sets (those the stdlib
#: search would find with one bytes.find each; again if that choice changes), it returns a
#: finder: ``finder(data, start, end)`` returns ``(position, set index)`` for every occurrence
#: in ``data[start:end]`` of a literal of a set (any position inside it).
# typing.Tuple, not tuple[...]: these are evaluated at import, and targets may run Python 3.8.
Finder = Callable[[bytes, int, int], Iterable[Tuple[int, int]]]
Prefilter = Callable[[Tuple[Tuple[bytes, ...], ...]], Finder]

#: (searcher: a literal or a regex of literals sharing a prefix, its literals, owner rules or None)
_Group = Tuple[Union[bytes, "re.Pattern[bytes]"], Tuple[bytes, ...], Optional[Tuple["Rule", ...]]]

#: Kept beside line ends by the survey's pass: progress bars hold them, so "\r\n" among the
#: kept bytes is nearly always a real CRLF, not a bar's CR and a later LF (then it is counted).
_SEPARATORS = b"%["
_LINE_BYTES = b"\r\n" + _SEPARATORS
_NOT_ANCHORS = frozenset(_LINE_BYTES + b"\x1b")
_NOT_EOL = bytes(c for c in range(256) if c not in b"\r\n")
#: The anchors are chosen on this many bytes of the log, again every _REPLAN bytes.
_SAMPLE = 1 << 16
_REPLAN = 32 << 20
#: Ties between equally rare bytes in a sample go to the byte rarer in logs in general.
_COMMON, _LESS_COMMON = b" etaoinsrlcdu0123456789", b"hmpfgwybvkxjqz.,:-_/=()'\""
_PRIOR = bytes(2 if c in _COMMON else 1 if c in _LESS_COMMON else 0 for c in range(256))


def _scanners(rules: Sequence[Rule]) -> tuple[tuple[Rule, ...], tuple[_Group, ...]]:
    """What the fast path searches for: (rules to search line by line, literal groups).

    A group is (searcher, literals, owners): a line holding one of the literals
    is matched if one of its owner rules matches it, or always (owners None: a
    traceback header, a follow-up line). A rule that waits for a follow-up line
    is found through the follow-up's literals and its wait replayed from the last
    lines. Literals sharing a prefix are searched as one regex (one scan for the
    prefix); a literal containing another is found by the shorter one.
    """
    owners: dict[str, list[Rule] | None] = {}
    unfiltered: list[Rule] = []

    def add(literal: str, rule: Rule | None) -> None:
        if rule is None:
            owners[literal] = None
        elif owners.setdefault(literal, []) is not None:
            owners[literal].append(rule)  # type: ignore[union-attr]

    for rule in rules:
        if rule.kind == "exception":
            add(_TB_TRIGGER, None)
            continue
        if rule.follow_regex is not None:
            follow = _required_literals(rule.follow_regex) if rule.follow_within < _RECENT else ()
            literals = follow or rule.triggers
            if literals and all(literals):
                for literal in literals:
                    add(literal, None)
                continue
        elif rule.triggers and all(rule.triggers):
            for literal in rule.triggers:
                add(literal, rule)
            continue
        unfiltered.append(rule)
    kept: dict[bytes, list[Rule] | None] = {}
    for literal in sorted(owners, key=len):
        encoded = literal.encode()
        into = next((k for k in kept if k in encoded), encoded)
        _merge(kept, into, owners[literal])
    groups: dict[bytes, dict[bytes, list[Rule] | None]] = {}
    for encoded, own in sorted(kept.items(), key=lambda kv: -len(kv[0])):
        groups.setdefault(encoded[:4] if len(encoded) < 12 else encoded, {})[encoded] = own
    scanners = []
    for members in groups.values():
        merged: dict[bytes, list[Rule] | None] = {}
        for own in members.values():
            _merge(merged, b"", own)
        searcher = next(iter(members)) if len(members) == 1 else re.compile(b"|".join(map(re.escape, members)))
        own = merged[b""]
        scanners.append((searcher, tuple(members), None if own is None else tuple(dict.fromkeys(own))))
    return tuple(unfiltered), tuple(scanners)


def _merge(table: dict, key: bytes, own: list[Rule] | None) -> None:
    """Add owners to table[key]; None (always match the line) wins."""
    if own is None or table.get(key, []) is None:
        table[key] = None
    else:
        table.setdefault(key, []).extend(own)


def _delete_all_but(keep: bytes) -> bytes:
    """The delete argument of bytes.translate that keeps line ends, ESC, separators and ``keep``."""
    kept = set(_LINE_BYTES + b"\x1b" + keep)
    return bytes(c for c in range(256) if c not in kept)


def _sample(data: bytes, start: int, end: int) -> bytes:
    """About _SAMPLE bytes of data[start:end], taken from four places."""
    if end - start <= _SAMPLE:
        return data[start:end]
    step, size = (end - start) // 4, _SAMPLE // 4
    return b"".join(data[p : p + size] for p in range(start, start + 4 * step, step))


class _Chunk:
    """What the survey of a chunk's complete lines found, used until the chunk is done."""

    __slots__ = ("end", "eols", "first_line", "has_cr", "crlf", "found", "next")

    def __init__(self, end: int, eols: int, first_line: int, has_cr: bool, crlf: bool) -> None:
        self.end = end
        self.eols = eols  # line ends from the survey's start to end
        self.first_line = first_line  # the number of the survey's first line
        self.has_cr = has_cr
        self.crlf = crlf  # False: certainly no CRLF
        self.found: list[tuple[int, int]] = []  # (position, group index or -1: match the line), sorted
        self.next = 0  # the first entry of found not looked at yet

    def count(self, data: bytes, start: int, stop: int) -> int:
        """Line ends in data[start:stop] (line-aligned: a CRLF is never split)."""
        n = data.count(b"\n", start, stop)
        if self.has_cr:
            n += data.count(b"\r", start, stop)
            if self.crlf:
                n -= data.count(b"\r\n", start, stop)
        return n


class _Literals:
    """Finds the trigger literals of a chunk.

    A literal holding a byte that is rare in the log is found through that byte
    (its anchor): the survey's translate pass keeps anchors, so a chunk without
    them costs nothing more, and each anchor found is checked with startswith.
    Rarity is measured on a sample of the log, again every _REPLAN bytes and
    whenever an anchor turns out frequent in a chunk (that chunk then falls back).
    Groups with a literal lacking a rare byte are searched: by the prefilter if
    there is one (all of them in one pass, compiled once per set of groups), else
    with bytes.find per literal, one regex for literals sharing a prefix.
    """

    def __init__(self, groups: tuple[_Group, ...], prefilter: Prefilter | None = None) -> None:
        self._groups = tuple((s, lits, -1 if own is None else i) for i, (s, lits, own) in enumerate(groups))
        self._bytes = sorted({c for _, lits, _ in groups for lit in lits for c in lit} - _NOT_ANCHORS)
        self.anchors: dict[int, list[tuple[bytes, int, int]]] = {}  # byte -> (literal, offset, key)
        self._anchored_groups: dict[int, set[int]] = {}  # byte -> indexes of groups using it
        self._searched = tuple(range(len(groups)))
        self._left = 0  # bytes to survey before the next plan
        self._prefilter = prefilter
        self._finders: dict[tuple[int, ...], Finder] = {}  # searched groups -> the prefilter's finder

    def due(self, n: int) -> bool:
        self._left -= n
        return self._left < 0

    def plan(self, sample: bytes) -> None:
        """Choose each literal's anchor: its rarest byte in ``sample``, if rare enough."""
        counts = {c: sample.count(bytes((c,))) for c in self._bytes}
        rare = len(sample) >> 13
        self.anchors = {}
        self._anchored_groups = {}
        searched = []
        for i, (_, literals, key) in enumerate(self._groups):
            picks = []
            for lit in literals:
                usable = set(lit) - _NOT_ANCHORS
                c = min(usable, key=lambda c: (counts[c], _PRIOR[c], lit.count(c), c), default=None)
                if c is None or counts[c] > rare:
                    searched.append(i)
                    break
                picks.append((c, lit))
            else:
                for c, lit in picks:
                    self.anchors.setdefault(c, []).append((lit, lit.index(c), key))
                    self._anchored_groups.setdefault(c, set()).add(i)
        self._searched = tuple(searched)
        self._left = _REPLAN if len(sample) >= _SAMPLE else _SAMPLE

    def find_anchored(self, data: bytes, start: int, end: int, rest: bytes, found: list[tuple[int, int]]) -> None:
        """Occurrences of anchored literals; ``rest`` holds the chunk's anchor bytes."""
        dense = ((end - start) >> 11) + 16
        for c, entries in self.anchors.items():
            if c not in rest:
                continue
            if rest.count(c) > dense:  # frequent after all: search its groups, choose again
                self._left = 0
                self._searched = tuple(sorted(set(self._searched) | self._anchored_groups[c]))
                continue
            needle = bytes((c,))
            p = data.find(needle, start, end)
            while p >= 0:
                for lit, offset, key in entries:
                    q = p - offset
                    if q >= start and data.startswith(lit, q, end):
                        found.append((q, key))
                p = data.find(needle, p + 1, end)

    def find_searched(self, data: bytes, start: int, end: int, found: list[tuple[int, int]]) -> None:
        """Occurrences of the literals of groups without anchors."""
        if self._prefilter is not None and self._searched:
            searched = self._searched
            finder = self._finders.get(searched)
            if finder is None:
                if len(self._finders) >= 8:
                    self._finders.clear()
                finder = self._finders[searched] = self._prefilter(tuple(self._groups[i][1] for i in searched))
            keys = tuple(self._groups[i][2] for i in searched)
            found.extend((p, keys[j]) for p, j in finder(data, start, end))
            return
        for i in self._searched:
            searcher, _, key = self._groups[i]
            if type(searcher) is bytes:
                p = data.find(searcher, start, end)
                while p >= 0:
                    found.append((p, key))
                    p = data.find(searcher, p + len(searcher), end)
            else:
                found.extend((m.start(), key) for m in searcher.finditer(data, start, end))  # type: ignore[union-attr]


def _next_eol(data: bytes, pos: int, end: int) -> int:
    """Index of the first LF or CR in data[pos:end], or -1."""
    lf = data.find(b"\n", pos, end)
    cr = data.find(b"\r", pos, lf if lf >= 0 else end)
    return cr if cr >= 0 else lf


def _eol(data: bytes, pos: int, end: int, has_cr: bool) -> int:
    """Index of the line end at or after pos (data[pos:end] ends with a line end)."""
    lf = data.find(b"\n", pos, end)
    if lf < 0:
        lf = end
    if has_cr:
        cr = data.find(b"\r", pos, lf)
        if cr >= 0:
            return cr
    return lf


def _last_lines(data: bytes, start: int, end: int, has_cr: bool, k: int) -> list[tuple[int, int]]:
    """(start, end) of the last k complete lines of data[start:end], oldest first."""
    out: list[tuple[int, int]] = []
    stop = end
    while stop > start and len(out) < k:
        le = stop - 1
        if data[le] == 10 and le > start and data[le - 1] == 13:
            le -= 1
        lf = data.rfind(b"\n", start, le)
        cr = data.rfind(b"\r", lf + 1 if lf >= 0 else start, le) if has_cr else -1
        ls = max(lf, cr) + 1 or start
        out.append((ls, le))
        stop = ls
    out.reverse()
    return out


def _search_lines(data: bytes, start: int, end: int, rules: Sequence[Rule], guard: Guard, limit: int) -> list[int]:
    """Rules without trigger literals: search each line, the region decoded at once.

    Decoding the whole region equals decoding line by line (lines split at
    ASCII bytes), and escape sequences never span a line end; a line longer
    than max_line is always a candidate (it is matched truncated).
    """
    region = data[start:end]
    lines = region.splitlines(keepends=True)
    flat = region.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    text = flat.decode("utf-8", "replace")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    texts = text.split("\n")
    texts.pop()  # the region ends with a line end
    marked: set[int] = set()
    for rule in rules:
        if rule.kind in _UNTRUSTED:
            name, regex = rule.name, rule.regex
            marked.update(i for i, t in enumerate(texts) if guard.search(name, regex, t))
        else:
            search = rule.regex.search
            marked.update(i for i, t in enumerate(texts) if search(t))
    if lines and max(map(len, lines)) > limit:
        marked.update(i for i, line in enumerate(lines) if len(line) > limit)
    if not marked:
        return []
    starts = list(accumulate(map(len, lines), initial=start))
    return [starts[i] for i in marked]
