"""Fatal-signature matcher for training logs: bytes in, hits out.

This module imports only the standard library and nothing from gpuops, so it can
be copied as-is into a container and run as a watchdog. It does no I/O.

A ``Matcher`` is fed the log's bytes in chunks of any size and returns a ``Hit``
for every line that matches a rule. Lines end at ``\\n``, ``\\r\\n`` or a lone
``\\r`` (tqdm bars); ANSI escape sequences are removed and invalid UTF-8 is
replaced before matching. At most ``max_line`` bytes of a line (its start) are
kept, so memory stays bounded whatever the input.

Rule kinds:

* ``exception``: the pattern must match the exception line of a Python traceback
  (``Type: message`` after a ``Traceback (most recent call last):`` header seen
  recently). A message that is merely mentioned (a config echo, a note, a quote)
  never matches. Tracebacks of several threads may interleave, and a per-line
  prefix (torchrun's ``[rank0]: ``, a logging timestamp) is detected on the
  header and stripped from the lines after it.
* ``line``: the pattern is searched in each line; with ``follow`` set, a line
  within ``follow_within`` lines after it must match ``follow`` as well.
* ``regex``: a playbook rule, searched in each line (see ``regex_rule``).

Speed: most of a training log matches nothing, so the matcher works on whole
chunks with C-speed primitives. One ``bytes.translate`` pass per chunk keeps only
line ends, escape bytes and a few more (``Matcher._survey``): the line count comes from
what it kept (the count must cover every byte: a later hit's number depends on it),
and so does whether the chunk holds an escape sequence or a trigger literal's
anchor, a byte of it that is rare in this log (measured on a sample). Literals
without a rare byte are found with ``bytes.find`` (a regex for literals sharing a
prefix), or by a ``prefilter`` such as hyperscan's (``gpuops.signatures.accel``).
Only lines holding a trigger or an escape sequence, and every line while a
traceback or a wait is open, are decoded and matched one by one, by the same code
that would match every line; the result is identical either way (tests compare the
two). A rule whose regex has no literal text is searched in every line of the
decoded chunk, several times slower.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

from .guard import Guard

__all__ = ["ABORT", "WARN", "METRIC", "Hit", "Measure", "Matcher", "Rule", "builtin_rules", "metric_rule", "regex_rule"]

ABORT = "abort"
WARN = "warn"
METRIC = "metric"
_ACTIONS = (ABORT, WARN)
_KINDS = ("exception", "line", "regex", "metric")
#: Kinds whose patterns a user wrote: searched under the Guard's time budget.
_UNTRUSTED = ("regex", "metric")

#: A traceback stays open this many lines after its last line.
TRACEBACK_WINDOW = 500
#: At most this many tracebacks are followed at once (threads printing together).
MAX_OPEN_TRACEBACKS = 32
#: Excerpt bounds: lines, characters per line, characters in all.
EXCERPT_LINES = 40
EXCERPT_LINE_CHARS = 1000
EXCERPT_CHARS = 8192

_TB_HEADER = "Traceback (most recent call last):"
_TB_TRIGGER = "(most recent call "  # also in faulthandler's stack headers: one search finds both
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\r\n]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_EXC_LINE = re.compile(r"[A-Za-z_][\w.]*(?::|$)")
_TORN_HEAD = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failed))\s+\S")
_TIME_LIKE = re.compile(r"\d:\d\d")
_CONTEXT_LINE = re.compile(r"(?i)\b(?:error|exception|critical|fatal|failed)\b|:\s*$")
_THREAD_LINE = "Exception in thread "
_RECENT = 8
_RANK = r"(?:\[(?:rank|default)\d+\]:\s?)?"


@dataclass(frozen=True)
class Rule:
    """A named signature; ``pattern`` is a Python regex over a cleaned line.

    ``exception`` rules match it at the start of a traceback's exception line
    (prefix stripped); ``line`` and ``regex`` rules search it anywhere in a line.
    ``triggers`` are literal strings of which every line the rule can match
    contains at least one; the matcher skips lines without any. Empty means
    unknown: every line is then checked (slower). Exception rules need none.
    ``follow``/``follow_within``: the hit only counts if one of the next
    ``follow_within`` lines matches ``follow``; it is reported then, with the
    first line's number and offset.
    """

    name: str
    kind: str
    action: str
    description: str
    pattern: str
    triggers: tuple[str, ...] = ()
    follow: str = ""
    follow_within: int = 0
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    follow_regex: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a rule needs a name")
        if self.kind not in _KINDS:
            raise ValueError(f"rule {self.name!r}: kind must be one of {', '.join(_KINDS)}, not {self.kind!r}")
        if (self.kind == "metric") != (self.action == METRIC):
            raise ValueError(f"rule {self.name!r}: a metric rule (and only one) has action 'metric'")
        if self.action not in _ACTIONS and self.kind != "metric":
            raise ValueError(f"rule {self.name!r}: action must be abort or warn, not {self.action!r}")
        object.__setattr__(self, "regex", _compile(self.name, self.pattern))
        follow = _compile(self.name, self.follow) if self.follow else None
        if follow is not None and self.follow_within < 1:
            raise ValueError(f"rule {self.name!r}: follow needs follow_within >= 1")
        object.__setattr__(self, "follow_regex", follow)


@dataclass(frozen=True)
class Measure:
    """A figure read off a log line by a metric rule (its first group, else the whole match)."""

    rule: str
    value: str
    line_number: int
    offset: int


@dataclass(frozen=True)
class Hit:
    """One matched line, with where it is and the traceback or context around it."""

    rule: str
    action: str
    description: str
    line: str
    line_number: int
    offset: int
    excerpt: str


def _compile(name: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"rule {name!r}: bad pattern {pattern!r}: {exc}") from None


def _exception(name: str, description: str, pattern: str) -> Rule:
    return Rule(name, "exception", ABORT, description, pattern)


def builtin_rules() -> list[Rule]:
    """The built-in library, in priority order (first match wins on a line).

    fx-tracing-race
        ``RuntimeError: Detected that you are using FX to symbolically trace a
        dynamo-optimized function`` as a traceback's exception line: threads
        sharing ``torch.compile`` raced (PyTorch < 2.14); drafters fall back to
        eager mode and the run crawls on.
    cuda-oom
        ``torch.OutOfMemoryError: CUDA out of memory.`` (also
        ``torch.cuda.OutOfMemoryError`` and ``RuntimeError: CUDA out of memory``).
    cuda-error
        ``torch.AcceleratorError: CUDA error: ...`` / ``RuntimeError: CUDA error:
        ...`` (illegal memory access, device-side assert triggered, ...).
    nccl-watchdog-timeout
        ProcessGroupNCCL's ``Watchdog caught collective operation timeout`` log line.
    nccl-error
        ``torch.distributed.DistBackendError: NCCL error in: ...`` and
        ``NCCL communicator was aborted`` exceptions.
    compile-failed
        ``torch._dynamo.exc.BackendCompilerFailed`` and
        ``torch._inductor.exc.InductorError`` exceptions.
    segfault
        ``Fatal Python error: ...`` at the start of a line (faulthandler on
        SIGSEGV, SIGABRT, ...) and bash's ``Segmentation fault (core dumped)``.
    faulthandler-timeout
        faulthandler's ``Timeout (0:04:00)!`` followed within 5 lines by a
        ``Thread 0x... (most recent call first):`` stack: the process hung.
    fx-patcher-race
        ``AssertionError: CURRENT_PATCHER is None in finally block`` raised in
        ``torch/fx/_symbolic_trace.py``: the same thread-safety family as the
        FX-tracing race, hit by the eager fallback's make_fx (torch 2.11).
    flex-attention-unfused (warn)
        ``UserWarning: flex_attention called without torch.compile()``: the run
        is on the unfused slow path.
    recompile-limit (warn)
        ``torch._dynamo hit config.recompile_limit (8)`` (older:
        ``cache_size_limit``): warmup did not cover a shape; dynamo runs eager.
    """
    return [
        _exception(
            "fx-tracing-race",
            "PyTorch FX-tracing race between threads sharing torch.compile",
            r"[A-Za-z_][\w.]*: Detected that you are using FX to symbolically trace a dynamo-optimized function",
        ),
        _exception(
            "fx-patcher-race",
            "PyTorch FX thread-safety race: threads tracing at once (the eager fallback's make_fx patcher is "
            "process-global); a drafter thread died and the rest run on",
            r"AssertionError: CURRENT_PATCHER is None in finally block",
        ),
        _exception(
            "cuda-oom",
            "CUDA out of memory",
            r"(?:torch\.(?:cuda\.)?OutOfMemoryError|RuntimeError): CUDA out of memory",
        ),
        _exception(
            "cuda-error",
            "CUDA error (illegal memory access, device-side assert, ...)",
            r"(?:torch\.AcceleratorError|RuntimeError|torch\.cuda\.CudaError): CUDA error: ",
        ),
        Rule(
            "nccl-watchdog-timeout",
            "line",
            ABORT,
            "NCCL watchdog: a collective operation timed out",
            r"Watchdog caught collective operation timeout",
            triggers=("Watchdog caught collective operation timeout",),
        ),
        _exception(
            "nccl-error",
            "NCCL error in a collective operation",
            r"[A-Za-z_][\w.]*: (?:\[[^\]]*\]\s*)*(?:NCCL error\b|NCCL communicator was aborted)",
        ),
        _exception(
            "compile-failed",
            "torch.compile failed (backend compiler / inductor error)",
            r"torch\._dynamo\.exc\.BackendCompilerFailed:|torch\._inductor\.exc\.InductorError:",
        ),
        Rule(
            "segfault",
            "line",
            ABORT,
            "the process crashed (segmentation fault or another fatal error)",
            "^" + _RANK + r"Fatal Python error: \S"
            r"|^(?:\S.*: line \d+: +\d+ |\[\d+\][+-]? +(?:\d+ +)?)Segmentation fault\b"
            r"|^Segmentation fault(?: +\(core dumped\))?\s*$",
            triggers=("Fatal Python error: ", "Segmentation fault"),
        ),
        Rule(
            "faulthandler-timeout",
            "line",
            ABORT,
            "the process hung: faulthandler's timeout dumped its stacks",
            "^" + _RANK + r"Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!\s*$",
            triggers=("Timeout (",),
            follow="^" + _RANK + r"(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+ |Stack )\(most recent call first\):",
            follow_within=5,
        ),
        Rule(
            "flex-attention-unfused",
            "line",
            WARN,
            "flex_attention ran without torch.compile: the unfused slow path (the eager fallback), "
            "materialising the full scores matrix",
            r"UserWarning: flex_attention called without torch\.compile\(\)",
            triggers=("flex_attention called without torch.compile",),
        ),
        Rule(
            "recompile-limit",
            "line",
            WARN,
            "torch._dynamo hit its recompile limit: warmup did not cover a shape",
            r"(?:torch\._dynamo|torchdynamo) hit config\.\w*(?:recompile_limit|cache_size_limit) \(\d+\)",
            triggers=("dynamo hit config.",),
        ),
    ]


def regex_rule(name: str, pattern: str, action: str = ABORT) -> Rule:
    """A playbook rule: ``pattern`` (a Python regex) searched in each cleaned line.

    Raises ValueError with the rule name and the regex error on a bad pattern.
    The literal text every match must contain becomes the rule's triggers; a
    pattern without any (``^\\d+$``, or case-insensitive) is searched in every
    line, several times slower.
    """
    regex = _compile(name, pattern)
    return Rule(
        name,
        "regex",
        action,
        f"log line matches playbook rule {name!r}: {pattern}",
        pattern,
        triggers=_required_literals(regex),
    )


def metric_rule(name: str, pattern: str) -> Rule:
    """A rule that reads a figure off every line it matches (``Matcher.take_measures``), never a hit."""
    regex = _compile(name, pattern)
    return Rule(name, "metric", METRIC, f"figure read by {pattern}", pattern, triggers=_required_literals(regex))


# --- literal extraction for playbook regexes (what grep calls "must" strings) ---

try:  # Python >= 3.11
    from re import _constants as _sre_c
    from re import _parser as _sre_parse
except ImportError:  # Python 3.10
    import sre_constants as _sre_c  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_MAX_ALTERNATIVES = 16
_REPEATS = tuple(
    getattr(_sre_c, op) for op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_sre_c, op)
)
_ZERO_WIDTH = (_sre_c.AT, _sre_c.ASSERT, _sre_c.ASSERT_NOT)


def _required_literals(regex: re.Pattern[str]) -> tuple[str, ...]:
    """Strings of which every match contains one; () when none is certain."""
    if regex.flags & re.IGNORECASE:
        return ()
    try:
        best = _best(_required(list(_sre_parse.parse(regex.pattern))))
    except Exception:  # an internal parser we do not control: fall back to "unknown"
        return ()
    if not best or any("\ufffd" in s for s in best):
        return ()
    return tuple(sorted(best))


def _exact_item(op: object, av: object) -> set[str] | None:
    """The small finite set of strings one parsed item matches, or None."""
    if op is _sre_c.LITERAL:
        return {chr(av)}  # type: ignore[arg-type]
    if op in _ZERO_WIDTH:
        return {""}
    if op is _sre_c.SUBPATTERN:
        if av[1] & re.IGNORECASE:  # type: ignore[index]
            return None
        return _exact(av[-1])  # type: ignore[index]
    if op is _sre_c.BRANCH:
        out: set[str] = set()
        for alt in av[1]:  # type: ignore[index]
            s = _exact(alt)
            if s is None:
                return None
            out |= s
        return out if len(out) <= _MAX_ALTERNATIVES else None
    if op is _sre_c.IN:
        if all(o is _sre_c.LITERAL for o, _ in av) and len(av) <= _MAX_ALTERNATIVES:  # type: ignore[union-attr]
            return {chr(c) for _, c in av}  # type: ignore[union-attr]
        return None
    if op in _REPEATS:
        lo, hi, sub = av  # type: ignore[misc]
        s = _exact(sub)
        if s is None or lo != hi or lo > 8:
            return None
        out = {""}
        for _ in range(lo):
            out = {a + b for a in out for b in s}
            if len(out) > _MAX_ALTERNATIVES:
                return None
        return out
    return None


def _exact(items: object) -> set[str] | None:
    out = {""}
    for op, av in items:  # type: ignore[attr-defined]
        s = _exact_item(op, av)
        if s is None:
            return None
        out = {a + b for a in out for b in s}
        if len(out) > _MAX_ALTERNATIVES:
            return None
    return out


def _required(items: list) -> list[set[str]]:
    """Candidate sets: every match contains a string from each returned set."""
    found: list[set[str]] = []
    run = {""}
    for op, av in items:
        s = _exact_item(op, av)
        if s is not None:
            grown = {a + b for a in run for b in s}
            if len(grown) <= _MAX_ALTERNATIVES:
                run = grown
                continue
        if run != {""}:
            found.append(run)
        run = {""}
        if op is _sre_c.SUBPATTERN and not av[1] & re.IGNORECASE:
            found.extend(_required(list(av[-1])))
        elif op in _REPEATS and av[0] >= 1:
            found.extend(_required(list(av[2])))
        elif op is _sre_c.BRANCH:
            alts = [_best(_required(list(alt))) for alt in av[1]]
            if all(alts) and sum(len(a) for a in alts) <= _MAX_ALTERNATIVES:  # type: ignore[arg-type]
                found.append(set().union(*alts))  # type: ignore[arg-type]
    if run != {""}:
        found.append(run)
    return found


def _best(candidates: list[set[str]]) -> set[str] | None:
    """The most selective candidate set: longest shortest string, then fewest."""
    usable = [c for c in candidates if c and min(map(len, c)) >= 3]
    if not usable:
        return None
    return max(usable, key=lambda c: (min(map(len, c)), -len(c)))


# --- per-line state ---


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


@dataclass
class _Pending:
    rule: Rule
    text: str
    line_number: int
    offset: int
    deadline: int
    lines: list[str]


#: ``Matcher(prefilter=...)``: called with trigger literals grouped in sets (those the stdlib
#: search would find with one bytes.find each; again if that choice changes), it returns a
#: finder: ``finder(data, start, end)`` returns ``(position, set index)`` for every occurrence
#: in ``data[start:end]`` of a literal of a set (any position inside it).
# typing.Tuple, not tuple[...]: these are evaluated at import, and targets may run Python 3.8.
Finder = Callable[[bytes, int, int], Iterable[Tuple[int, int]]]
Prefilter = Callable[[Tuple[Tuple[bytes, ...], ...]], Finder]


class Matcher:
    """Feed a log's bytes in chunks of any size; get a Hit for every matching line.

    Rule order is priority: the first rule that matches a line wins. Hits come
    back from the ``feed`` (or ``finish``) call that completes the line.
    ``prefilter`` takes over the search for the trigger literals that have no byte
    rare in the log (``gpuops.signatures.accel`` has one in hyperscan); the hits
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
        self._tracebacks: list[_Traceback] = []
        self._pending: list[_Pending] = []
        self._seq = 0
        self._exceptions = any(r.kind == "exception" for r in self._rules)
        self._waiting = tuple(r for r in self._rules if r.follow_regex is not None)
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
            found.extend((p, -1) for p in self._search_lines(data, start, end))
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

    def _search_lines(self, data: bytes, start: int, end: int) -> list[int]:
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
        for rule in self._unfiltered:
            if rule.kind in _UNTRUSTED:
                guard, name, regex = self.guard, rule.name, rule.regex
                marked.update(i for i, t in enumerate(texts) if guard.search(name, regex, t))
            else:
                search = rule.regex.search
                marked.update(i for i, t in enumerate(texts) if search(t))
        limit = self._max_line
        if lines and max(map(len, lines)) > limit:
            marked.update(i for i, line in enumerate(lines) if len(line) > limit)
        if not marked:
            return []
        starts = list(accumulate(map(len, lines), initial=start))
        return [starts[i] for i in marked]

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
        if self._waiting and self._done < self._line_no - 1 and not self._pending:
            self._replay_waits()
        self._line(raw, offset, hits)

    def _replay_waits(self) -> None:
        """Skipped lines that start a wait (faulthandler's "Timeout") only matter if a
        follow-up line comes, so the scan looks for follow-ups and starts the wait here."""
        for line_no, offset, raw in self._recent:
            if line_no <= self._done:
                continue
            text = _clean(raw)
            for p in self._pending:
                p.lines.append(self._short(text))
            for rule in self._waiting:
                if line_no + rule.follow_within >= self._line_no and rule.regex.search(text):
                    deadline = line_no + rule.follow_within
                    self._pending.append(_Pending(rule, text, line_no, offset, deadline, [self._short(text)]))

    def _line(self, raw: bytes, offset: int, hits: list[Hit]) -> None:
        """Match one line (the reference semantics; the fast path only skips lines)."""
        line_no = self._line_no
        self._line_no += 1
        text = _clean(raw)
        if self._pending:
            self._follow(text, line_no, hits)
        body = None
        lines = None
        if self._exceptions:
            body, lines = self._traceback(text, line_no)
            if body is None and self._tracebacks and text.startswith(": "):
                body, lines = self._torn(text, line_no)
        for rule in self._rules:
            if rule.kind == "exception":
                if body is None or not rule.regex.match(body):
                    continue
                excerpt = lines.join() if lines is not None else text
            else:
                if not self._search(rule, text):
                    continue
                if rule.follow_regex is not None:
                    deadline = line_no + rule.follow_within
                    self._pending.append(_Pending(rule, text, line_no, offset, deadline, [self._short(text)]))
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
        waiting = [tb for tb in self._tracebacks if tb.mode != 1 and tb.last_kind == _CODE]
        if head is None or not waiting:
            return None, None
        tb = max(waiting, key=lambda t: t.seq)
        self._tracebacks.remove(tb)
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

    def _follow(self, text: str, line_no: int, hits: list[Hit]) -> None:
        """Confirm or expire rules waiting for a follow-up line."""
        keep = []
        for p in self._pending:
            p.lines.append(self._short(text))
            if p.rule.follow_regex is not None and p.rule.follow_regex.search(text):
                excerpt = _excerpt(p.lines, (), 0)
                hits.append(Hit(p.rule.name, p.rule.action, p.rule.description, self._mask(p.text), p.line_number,
                                p.offset, excerpt))
            elif line_no < p.deadline:
                keep.append(p)
        self._pending = keep

    def _traceback(self, text: str, line_no: int) -> tuple[str | None, _Lines | None]:
        """Track open tracebacks; return (exception line body, excerpt lines) when one ends here."""
        tbs = self._tracebacks
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


# --- the fast path's chunk survey and literal search (standard library) ---

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
