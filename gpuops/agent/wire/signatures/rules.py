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

from ..builtin_rules import BUILTIN, FX_ADVICE, advice  # the list; FX_ADVICE and advice re-exported
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


def builtin_rules() -> list[Rule]:
    """The built-in library (wire/builtin_rules.BUILTIN), compiled, in priority order (first match wins on a line)."""
    return [Rule(b.name, b.kind, b.action, b.description, b.pattern, triggers=b.triggers, follow=b.follow,
                 follow_within=b.follow_within) for b in BUILTIN]


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
