"""Fatal-signature matcher for training logs: bytes in, hits out.

This package imports only the standard library and the agent's wire (the built-in rule list), so it
runs inside a container beside the run, in the watchdog. It does no I/O.

A ``Matcher`` is fed the log's bytes in chunks of any size and returns a ``Hit``
for every line that matches a rule. Lines end at ``\\n``, ``\\r\\n`` or a lone
``\\r`` (tqdm bars); ANSI escape sequences are removed and invalid UTF-8 is
replaced before matching. At most ``max_line`` bytes of a line (its start) are
kept, so memory stays bounded whatever the input.

The rules are data (``rules``). Most lines are never decoded: ``scan`` finds the few
that can match, and those, with every line while a traceback (``tracebacks``) or a
wait (``waits``) is open, go through the per-line path here, the same code that would
match every line; the hits are identical either way.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Callable, Sequence

from .budget import Guard
from .literals import _required_literals  # noqa: F401  (re-exported: tests read it here)
from .rules import _UNTRUSTED, ABORT, METRIC, WARN, Hit, Measure, Rule, builtin_rules, metric_rule, regex_rule
from .scan import (  # noqa: F401  (Finder re-exported: accel imports it here)
    _LINE_BYTES,
    _NOT_EOL,
    _RECENT,
    Finder,
    Prefilter,
    _Chunk,
    _delete_all_but,
    _eol,
    _last_lines,
    _Literals,
    _next_eol,
    _sample,
    _scanners,
    _search_lines,
)
from .text import EXCERPT_CHARS, EXCERPT_LINE_CHARS, EXCERPT_LINES, _clean, _same, _shorten  # noqa: F401  (re-exported)
from .tracebacks import MAX_OPEN_TRACEBACKS, TRACEBACK_WINDOW, Tracebacks  # noqa: F401  (the limits re-exported)
from .waits import Waits

__all__ = ["ABORT", "WARN", "METRIC", "Hit", "Measure", "Matcher", "Rule", "builtin_rules", "metric_rule", "regex_rule"]


class Matcher:
    """Feed a log's bytes in chunks of any size; get a Hit for every matching line.

    Rule order is priority: the first rule that matches a line wins. Hits come
    back from the ``feed`` (or ``finish``) call that completes the line.
    ``prefilter`` takes over the search for the trigger literals that have no byte
    rare in the log (``gpuops.client.view.accel`` has one in hyperscan); the hits
    are the same.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        start_offset: int = 0,
        start_line: int = 1,
        max_line: int = 65536,
        prefilter: Prefilter | None = None,
        mask: Callable[[str], str] | None = None,
        guard: Guard | None = None,
    ) -> None:
        if max_line < 1:
            raise ValueError("max_line must be at least 1")
        self._rules = tuple(r for r in rules if r.kind != "metric")
        self._metrics = tuple(r for r in rules if r.kind == "metric")
        self._max_line = max_line
        self._offset = start_offset  # stream offset of the next byte fed
        self._line_no = start_line  # number of the next line
        self._done = start_line - 1  # number of the last line matched (the others were skipped)
        self._mask = mask or _same
        self._short = (lambda text: _shorten(self._mask(text))) if mask else _shorten
        self.guard = guard if guard is not None else Guard()
        self._guarded = any(r.kind in _UNTRUSTED for r in rules)
        self._measures: list[Measure] = []
        self._tail = bytearray()  # start of the current partial line, at most max_line bytes
        self._tail_len = 0  # its full length so far
        self._tail_offset = 0
        self._skip_lf = False  # the last byte fed was CR: a leading LF ends the same line
        self._recent: deque[tuple[int, int, bytes]] = deque(maxlen=_RECENT)  # (line, offset, raw)
        self._tracker = Tracebacks(self._short, self._recent)
        self._tracebacks = self._tracker.open  # the tracker's list itself: _busy reads it on every line
        self._waits = Waits(self._rules, self._short, self._mask)
        self._pending = self._waits.pending  # the list itself: _busy reads it on every line
        self._exceptions = any(r.kind == "exception" for r in self._rules)
        self._unfiltered, groups = _scanners(self._rules + self._metrics)
        self._owners = tuple(owners for _, _, owners in groups)
        self._literals = _Literals(groups, prefilter)
        self._delete = _delete_all_but(b"")

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the current partial line held for matching (never above max_line)."""
        return len(self._tail)

    def feed(self, data: bytes) -> list[Hit]:
        """Consume the next bytes of the stream; return the hits of the lines they complete."""
        if not self._guarded:
            return self._feed(data)
        with self.guard:
            return self._feed(data)

    def take_measures(self) -> list[Measure]:
        """The figures metric rules read since the last call, in log order."""
        out, self._measures = self._measures, []
        return out

    @property
    def line_number(self) -> int:
        """The number of the next line (lines completed so far + 1)."""
        return self._line_no

    def checkpoint(self) -> tuple[int, int] | None:
        """(offset, line number) a new Matcher can start at and find the same hits from there on:
        the oldest line it remembers, when no traceback or wait is open; else None."""
        if self._busy() or self._tail_len:
            return None
        if self._recent:
            line_no, offset, _ = self._recent[0]
            return offset, line_no
        return self._offset, self._line_no

    def _feed(self, data: bytes) -> list[Hit]:
        if not isinstance(data, bytes):
            data = bytes(data)
        hits: list[Hit] = []
        n = len(data)
        pos = 0
        if n and self._skip_lf:
            self._skip_lf = False
            if data[0] == 10:
                pos = 1
        if self._tail_len and pos < n:
            end = _next_eol(data, pos, n)
            if end < 0:
                self._extend_tail(data, pos, n)
                self._offset += n
                return hits
            self._extend_tail(data, pos, end)
            raw, offset = bytes(self._tail), self._tail_offset
            self._tail, self._tail_len = bytearray(), 0
            pos = self._after_eol(data, end, n)
            self._visit(raw, offset, hits)
        last = max(data.rfind(b"\n", pos), data.rfind(b"\r", pos))
        if last >= 0:
            if last == n - 1 and data[last] == 13:
                self._skip_lf = True
            self._scan(data, pos, last + 1, hits)
            pos = last + 1
        if pos < n:
            self._tail_offset = self._offset + pos
            self._extend_tail(data, pos, n)
        self._offset += n
        return hits

    def finish(self) -> list[Hit]:
        """End of stream: match the last partial line, drop open tracebacks and waits."""
        if self._guarded:
            with self.guard:
                return self._finish()
        return self._finish()

    def _finish(self) -> list[Hit]:
        hits: list[Hit] = []
        if self._tail_len:
            raw, offset = bytes(self._tail), self._tail_offset
            self._tail, self._tail_len = bytearray(), 0
            self._visit(raw, offset, hits)
        self._tracebacks.clear()
        self._pending.clear()
        return hits

    # --- bytes to lines ---

    def _extend_tail(self, data: bytes, start: int, end: int) -> None:
        room = self._max_line - len(self._tail)
        if room > 0:
            self._tail += data[start : min(end, start + room)]
        self._tail_len += end - start

    def _after_eol(self, data: bytes, end: int, n: int) -> int:
        """Position after the line end at ``end``, noting a CR that may pair with the next feed."""
        if data[end] == 13:
            if end + 1 == n:
                self._skip_lf = True
            elif data[end + 1] == 10:
                return end + 2
        return end + 1

    def _busy(self) -> bool:
        return bool(self._tracebacks or self._pending)

    def _scan(self, data: bytes, pos: int, end: int, hits: list[Hit]) -> None:
        """Match the complete lines in data[pos:end]."""
        chunk: _Chunk | None = None  # surveyed the first time the fast path runs
        has_cr: bool | None = None
        while pos < end:
            if self._busy():
                if has_cr is None:
                    has_cr = chunk.has_cr if chunk is not None else data.find(b"\r", pos, end) >= 0
                pos = self._scan_slow(data, pos, end, has_cr, hits)
            else:
                if chunk is None:
                    chunk = self._survey(data, pos, end)
                pos = self._scan_fast(data, pos, end, chunk, hits)

    def _scan_slow(self, data: bytes, pos: int, end: int, has_cr: bool, hits: list[Hit]) -> int:
        """Every line, one by one, until no traceback or wait is open."""
        limit = self._max_line
        lf = cr = -1
        while pos < end:
            if lf < pos:
                lf = data.find(b"\n", pos, end)
                if lf < 0:
                    lf = end
            if has_cr and cr < pos:
                cr = data.find(b"\r", pos, end)
                if cr < 0:
                    cr = end
            eol = min(lf, cr) if has_cr else lf
            self._line(data[pos : min(eol, pos + limit)], self._offset + pos, hits)
            pos = eol + 2 if data[eol] == 13 and eol + 1 < end and data[eol + 1] == 10 else eol + 1
            if not self._busy():
                break
        return pos

    def _survey(self, data: bytes, start: int, end: int) -> _Chunk:
        """One translate pass over data: line ends, ESC, anchor bytes and separators are kept.

        They are few, so the rest is counted on them: the line ends of data[start:end]
        (data[end:] is a partial line without any; data[:start] is subtracted), whether
        a CR is there, and which anchors and escapes to look for. Then the chunk's
        candidate lines are found, once for all the fast-path runs over the chunk.
        """
        literals = self._literals
        if literals.due(end - start):
            literals.plan(_sample(data, start, end))
            self._delete = _delete_all_but(bytes(literals.anchors))
        kept = data.translate(None, self._delete)
        eols = kept.translate(None, _NOT_EOL)
        cr = eols.count(b"\r")
        lf = len(eols) - cr
        if start:
            lf -= data.count(b"\n", 0, start)
            cr -= data.count(b"\r", 0, start)
        crlf = 0
        if cr and lf and b"\r\n" in eols and b"\r\n" in kept:  # a CRLF, or CR ... LF without a separator
            crlf = data.count(b"\r\n", start, end)
        chunk = _Chunk(end, lf + cr - crlf, self._line_no, cr > 0, crlf > 0)
        found = chunk.found
        rest = kept.translate(None, _LINE_BYTES)  # ESC and anchor bytes, in the whole of data
        if rest:
            if 0x1B in rest:
                p = data.find(b"\x1b", start, end)
                while p >= 0:
                    found.append((p, -1))
                    p = data.find(b"\x1b", _eol(data, p, end, chunk.has_cr), end)
            literals.find_anchored(data, start, end, rest, found)
        literals.find_searched(data, start, end, found)
        if self._unfiltered:
            found.extend((p, -1) for p in _search_lines(data, start, end, self._unfiltered, self.guard, self._max_line))
        found.sort()
        return chunk

    def _scan_fast(self, data: bytes, start: int, end: int, chunk: _Chunk, hits: list[Hit]) -> int:
        """Only the lines holding a trigger literal (or an escape sequence)."""
        found = chunk.found
        has_cr = chunk.has_cr
        pos = start  # the first line neither skipped nor matched yet
        seen = start  # the end of the last line looked at
        k = chunk.next
        while k < len(found):
            p, key = found[k]
            k += 1
            if p < seen:
                continue
            lf = data.rfind(b"\n", seen, p)
            cr = data.rfind(b"\r", lf + 1 if lf >= 0 else seen, p) if has_cr else -1
            ls = max(lf, cr) + 1 or seen
            eol = _eol(data, ls, end, has_cr)
            keys = {key}
            while k < len(found) and found[k][0] < eol:
                keys.add(found[k][1])
                k += 1
            seen = eol + 2 if data[eol] == 13 and eol + 1 < end and data[eol + 1] == 10 else eol + 1
            raw = data[ls : min(eol, ls + self._max_line)]
            if -1 not in keys and not self._may_match(raw, keys):
                continue  # a frequent literal without its rule's match: the line is skipped
            self._skip(data, pos, ls, chunk)
            self._visit(raw, self._offset + ls, hits)
            pos = seen
            if self._busy():
                chunk.next = k
                return pos
        chunk.next = k
        self._skip(data, pos, end, chunk)
        return end

    def _may_match(self, raw: bytes, keys: set[int]) -> bool:
        """Does a rule owning one of the line's literals match it? (If not, matching the
        whole line would change nothing: no other rule's literal is in it.)"""
        text = _clean(raw)
        return any(self._search(rule, text) for key in keys for rule in self._owners[key])  # type: ignore[union-attr]

    def _search(self, rule: Rule, text: str) -> re.Match[str] | None:
        """A rule's regex searched in a line; a pattern a user wrote runs under the time budget."""
        if rule.kind in _UNTRUSTED:
            return self.guard.search(rule.name, rule.regex, text)
        return rule.regex.search(text)

    def _skip(self, data: bytes, start: int, stop: int, chunk: _Chunk) -> None:
        """Count complete lines that hold no trigger; remember the last few.

        The lines of the chunk before ``start`` are counted already, so the rest is
        known from the chunk's total: only the smaller side is counted.
        """
        if start >= stop:
            return
        if stop == chunk.end:
            n = chunk.eols - (self._line_no - chunk.first_line)
        elif stop - start <= chunk.end - stop:
            n = chunk.count(data, start, stop)
        else:
            n = chunk.eols - (self._line_no - chunk.first_line) - chunk.count(data, stop, chunk.end)
        self._line_no += n
        last = _last_lines(data, start, stop, chunk.has_cr, _RECENT)
        line_no = self._line_no - len(last)
        for ls, le in last:
            self._recent.append((line_no, self._offset + ls, data[ls : min(le, ls + self._max_line)]))
            line_no += 1

    # --- one line ---

    def _visit(self, raw: bytes, offset: int, hits: list[Hit]) -> None:
        """Match a line after skipped ones: first start the waits they would have started."""
        if self._waits.rules and self._done < self._line_no - 1 and not self._pending:
            self._waits.replay(self._recent, self._done, self._line_no)
        self._line(raw, offset, hits)

    def _line(self, raw: bytes, offset: int, hits: list[Hit]) -> None:
        """Match one line (the reference semantics; the fast path only skips lines)."""
        line_no = self._line_no
        self._line_no += 1
        text = _clean(raw)
        if self._pending:
            self._waits.follow(text, line_no, hits)
        body = None
        lines = None
        if self._exceptions:
            body, lines = self._tracker.line(text, line_no)
        for rule in self._rules:
            if rule.kind == "exception":
                if body is None or not rule.regex.match(body):
                    continue
                excerpt = lines.join() if lines is not None else text
            else:
                if not self._search(rule, text):
                    continue
                if rule.follow_regex is not None:
                    self._waits.start(rule, text, line_no, offset)
                    continue
                excerpt = self._short(text)
            hits.append(Hit(rule.name, rule.action, rule.description, self._mask(text), line_no, offset, excerpt))
            break
        for rule in self._metrics:
            found = self.guard.search(rule.name, rule.regex, text)
            if found:
                value = found.group(1) if found.re.groups else found.group(0)
                self._measures.append(Measure(rule.name, value, line_no, offset))
        self._done = line_no
        self._recent.append((line_no, offset, raw))
