"""Rules that wait for a follow-up line: a line that starts one (faulthandler's "Timeout") is a hit
only when its follow-up comes within `follow_within` lines; otherwise it is forgotten."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .rules import Hit, Rule
from .text import _clean, _excerpt


@dataclass
class _Pending:
    rule: Rule
    text: str
    line_number: int
    offset: int
    deadline: int
    lines: list[str]


class Waits:
    """The open waits of one Matcher; `pending` is the list itself (the matcher's fast path reads it per line)."""

    def __init__(self, rules: Sequence[Rule], short: Callable[[str], str], mask: Callable[[str], str]) -> None:
        self.rules = tuple(r for r in rules if r.follow_regex is not None)
        self.pending: list[_Pending] = []
        self._short = short
        self._mask = mask

    def start(self, rule: Rule, text: str, line_no: int, offset: int) -> None:
        """A line matched a waiting rule: wait for its follow-up."""
        self.pending.append(_Pending(rule, text, line_no, offset, line_no + rule.follow_within, [self._short(text)]))

    def replay(self, recent: Iterable[tuple[int, int, bytes]], done: int, line_no: int) -> None:
        """Skipped lines that start a wait only matter if a follow-up line comes, so the scan looks for
        follow-ups and the waits those skipped lines would have started are started here."""
        for number, offset, raw in recent:
            if number <= done:
                continue
            text = _clean(raw)
            for p in self.pending:
                p.lines.append(self._short(text))
            for rule in self.rules:
                if number + rule.follow_within >= line_no and rule.regex.search(text):
                    self.start(rule, text, number, offset)

    def follow(self, text: str, line_no: int, hits: list[Hit]) -> None:
        """Confirm or expire the waits with the next line."""
        keep = []
        for p in self.pending:
            p.lines.append(self._short(text))
            if p.rule.follow_regex is not None and p.rule.follow_regex.search(text):
                excerpt = _excerpt(p.lines, (), 0)
                hits.append(Hit(p.rule.name, p.rule.action, p.rule.description, self._mask(p.text), p.line_number,
                                p.offset, excerpt))
            elif line_no < p.deadline:
                keep.append(p)
        self.pending[:] = keep  # the same list: the matcher holds it
