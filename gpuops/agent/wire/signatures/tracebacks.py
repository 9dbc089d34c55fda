"""Python tracebacks followed through a log, line by line, until their exception line.

A header (``Traceback (most recent call last):``) opens one. Threads that fail together print
theirs interleaved, so each later line goes to the open traceback it fits best: the one whose
header's prefix it carries (torchrun's ``[rank0]: ``, a logging timestamp with other digits),
else one without a prefix. An exception line torn in two by another thread is put back
together. A traceback left without a line for ``TRACEBACK_WINDOW`` lines is dropped.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Callable

from .text import _clean, _Lines

#: A traceback stays open this many lines after its last line.
TRACEBACK_WINDOW = 500
#: At most this many tracebacks are followed at once (threads printing together).
MAX_OPEN_TRACEBACKS = 32

_TB_HEADER = "Traceback (most recent call last):"
_TB_TRIGGER = "(most recent call "  # also in faulthandler's stack headers: one search finds both
_EXC_LINE = re.compile(r"[A-Za-z_][\w.]*(?::|$)")
_TORN_HEAD = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failed))\s+\S")
_TIME_LIKE = re.compile(r"\d:\d\d")
_CONTEXT_LINE = re.compile(r"(?i)\b(?:error|exception|critical|fatal|failed)\b|:\s*$")
_THREAD_LINE = "Exception in thread "


_HEADER, _FILE, _CODE = 0, 1, 2


class _Traceback:
    """An open traceback: its header's prefix and the lines claimed so far."""

    __slots__ = ("prefix", "prefix_re", "mode", "last_kind", "last_line", "seq", "lines")

    def __init__(self, prefix: str, line_no: int, seq: int, context: str | None, header: str,
                 short: Callable[[str], str]) -> None:
        self.prefix = prefix
        general = re.sub(r"\d+", r"\\d+", re.escape(prefix)) if _TIME_LIKE.search(prefix) else None
        self.prefix_re = re.compile(general) if general else None
        self.mode = 0 if prefix else 2  # 0: not known yet, 1: lines carry the prefix, 2: bare lines
        self.last_kind = _HEADER
        self.last_line = line_no
        self.seq = seq
        self.lines = _Lines(short)
        if context is not None:
            self.lines.add(context)
        self.lines.add(header)

    def body(self, text: str) -> tuple[int, str] | None:
        """(preference, text without prefix) if this traceback could own the line."""
        if self.mode != 2:
            if text.startswith(self.prefix):
                return 0, text[len(self.prefix) :]
            if self.prefix_re is not None:
                m = self.prefix_re.match(text)
                if m:
                    return 1, text[m.end() :]
        if self.mode != 1:
            return 2, text
        return None


def _kind(body: str) -> int | None:
    """_FILE, _CODE, -1 for an exception line, None for a line no traceback owns."""
    if body.startswith("  File "):
        return _FILE
    if body[:1] in (" ", "\t"):
        return _CODE
    if _EXC_LINE.match(body):
        return -1
    return None


class Tracebacks:
    """The tracebacks open in a log, fed its lines in order; ``open`` is changed in place, never rebound."""

    def __init__(self, short: Callable[[str], str], recent: deque[tuple[int, int, bytes]]) -> None:
        self.open: list[_Traceback] = []
        self._seq = 0
        self._short = short  # masks secrets, then shortens: a cut never shows part of a secret
        self._recent = recent  # the last lines before this one: (line number, offset, raw)

    def line(self, text: str, line_no: int) -> tuple[str | None, _Lines | None]:
        """(exception line body, excerpt lines) when a traceback ends on this line, else (None, None)."""
        body, lines = self._track(text, line_no)
        if body is None and self.open and text.startswith(": "):
            body, lines = self._torn(text, line_no)
        return body, lines

    def _track(self, text: str, line_no: int) -> tuple[str | None, _Lines | None]:
        """Track open tracebacks; return (exception line body, excerpt lines) when one ends here."""
        tbs = self.open
        if tbs:
            tbs[:] = [tb for tb in tbs if line_no - tb.last_line <= TRACEBACK_WINDOW]
        i = text.find(_TB_HEADER)
        if i >= 0 and not text[i + len(_TB_HEADER) :].strip():
            context = self._header_context()
            self._seq += 1
            tbs.append(_Traceback(text[:i], line_no, self._seq, context, text, self._short))
            if len(tbs) > MAX_OPEN_TRACEBACKS:
                tbs.remove(min(tbs, key=lambda tb: tb.seq))
            return None, None
        if not tbs:
            return None, None
        best = None
        for tb in tbs:
            claim = tb.body(text)
            if claim is None:
                continue
            kind = _kind(claim[1])
            if kind is None or (tb.last_kind == _HEADER and kind != _FILE):
                continue
            key = (claim[0], tb.seq)
            if best is None or key < best[0]:
                best = (key, tb, claim, kind)
        if best is None:
            return None, None
        _, tb, (pref, body), kind = best
        if tb.mode == 0:
            tb.mode = 2 if pref == 2 else 1
        tb.lines.add(text)
        self._seq += 1
        tb.seq = self._seq
        tb.last_line = line_no
        if kind == -1:
            tbs.remove(tb)
            return body, tb.lines
        tb.last_kind = kind
        return None, None

    def _torn(self, text: str, line_no: int) -> tuple[str | None, _Lines | None]:
        """An exception line torn in two by another thread's output (seen in a real FX race):

            RuntimeError    raise RuntimeError(
            : Detected that you are using FX to symbolically trace a dynamo-optimized function.

        The message (": ...") starts a line of its own right after a line that starts with the
        exception's name and goes on with another thread's text. The name is put back in front
        of the message, and the newest traceback waiting for its exception line ends here."""
        prev = self._recent[-1] if self._recent else None
        if prev is None or prev[0] != line_no - 1:
            return None, None
        prev_text = _clean(prev[2])
        head = _TORN_HEAD.match(prev_text)
        waiting = [tb for tb in self.open if tb.mode != 1 and tb.last_kind == _CODE]
        if head is None or not waiting:
            return None, None
        tb = max(waiting, key=lambda t: t.seq)
        self.open.remove(tb)
        tb.lines.add(prev_text)
        tb.lines.add(text)
        return head.group(1) + text, tb.lines

    def _header_context(self) -> str | None:
        """The line that says whose traceback starts here: "Exception in thread X:" or a log record.

        Threads that die together print their "Exception in thread" lines and then
        their headers interleaved; the n-th header of such a run gets the n-th line.
        """
        recent = [_clean(raw) for _, _, raw in self._recent]
        threads: list[str] = []
        headers = 0
        for text in reversed(recent):
            if _TB_HEADER in text:
                headers += 1
            elif _THREAD_LINE in text:
                threads.append(text)
            else:
                break
        if threads:
            threads.reverse()
            return threads[headers] if headers < len(threads) else None
        prev = recent[-1] if recent else ""
        if not headers and prev.strip() and _CONTEXT_LINE.search(prev):
            return prev
        return None
