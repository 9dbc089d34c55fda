"""The signature rules as data: a Rule, what it finds (Hit, Measure), and the built-in library.

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
* ``metric``: a playbook figure read off each line it matches (see ``metric_rule``), never a hit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .literals import _required_literals

__all__ = ["ABORT", "WARN", "METRIC", "FX_ADVICE", "Hit", "Measure", "Rule", "advice", "builtin_rules", "metric_rule",
           "regex_rule"]

ABORT = "abort"
WARN = "warn"
METRIC = "metric"
_ACTIONS = (ABORT, WARN)
_KINDS = ("exception", "line", "regex", "metric")
#: Kinds whose patterns a user wrote: searched under the Guard's time budget.
_UNTRUSTED = ("regex", "metric")
#: torchrun's per-rank prefix ([rank0]: ), optional at the start of a line.
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


#: How to make the run succeed after the FX thread-safety family: shown with its matches (`advice`).
#: No PyTorch version is named: none was verified to end the race (see builtin_rules).
GUARD_HOWTO = ("turn on gpuops' compile guard (`launch.compile_guard: true`: the first calls of compiled code never "
               "overlap, no code change) and let the watchdog restart a run that still hits it (`restart: {max: 2, "
               "on: [fx-tracing-race, fx-patcher-race, stall], compile_guard: true}`)")
FX_ADVICE = ("threads traced or compiled at once (torch.compile is not thread-safe): " + GUARD_HOWTO
             + "; or compile each device's function under one lock before the threads start")
_ADVICE = {"fx-tracing-race": FX_ADVICE, "fx-patcher-race": FX_ADVICE}


def advice(rule: str) -> str | None:
    """What to do about a match of this built-in rule, if gpuops knows."""
    return _ADVICE.get(rule)


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
        sharing ``torch.compile`` raced; drafters fall back to eager mode and the
        run crawls on. (PyTorch made its tracing flag thread-local in pytorch#168999
        and the FX patcher in pytorch#187589; no release is named here because none
        was verified to end the race.)
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
