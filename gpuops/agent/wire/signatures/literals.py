"""The literal text every match of a regex must contain (what grep calls "must" strings).

A playbook regex's required literals become its rule's triggers: the matcher looks only at
lines holding one of them. They are read off the pattern as Python's own parser sees it;
whatever is uncertain (case-insensitive, too many alternatives, a parser this code does not
know) gives ``()``: no literal, and the rule is searched in every line.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Iterable, List, Tuple

if sys.version_info >= (3, 11):
    from re import _constants as _sre_c
    from re import _parser as _sre_parse
else:  # Python 3.8 to 3.10
    import sre_constants as _sre_c
    import sre_parse as _sre_parse

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
        best = _best(_required(list(_sre_parse.parse(regex.pattern).data)))
    except Exception:  # an internal parser we do not control: fall back to "unknown"
        return ()
    if not best or any("\ufffd" in s for s in best):
        return ()
    return tuple(sorted(best))


def _exact_item(op: object, av: Any) -> set[str] | None:  # av: the parser's, shaped by op
    """The small finite set of strings one parsed item matches, or None."""
    if op is _sre_c.LITERAL:
        return {chr(av)}
    if op in _ZERO_WIDTH:
        return {""}
    if op is _sre_c.SUBPATTERN:
        if av[1] & re.IGNORECASE:
            return None
        return _exact(av[-1])
    if op is _sre_c.BRANCH:
        out: set[str] = set()
        for alt in av[1]:
            s = _exact(alt)
            if s is None:
                return None
            out |= s
        return out if len(out) <= _MAX_ALTERNATIVES else None
    if op is _sre_c.IN:
        if all(o is _sre_c.LITERAL for o, _ in av) and len(av) <= _MAX_ALTERNATIVES:
            return {chr(c) for _, c in av}
        return None
    if op in _REPEATS:
        lo, hi, sub = av
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


def _exact(items: Iterable[Tuple[Any, Any]]) -> set[str] | None:
    out = {""}
    for op, av in items:
        s = _exact_item(op, av)
        if s is None:
            return None
        out = {a + b for a in out for b in s}
        if len(out) > _MAX_ALTERNATIVES:
            return None
    return out


def _required(items: List[Tuple[Any, Any]]) -> list[set[str]]:
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
            sets = [a for a in alts if a]
            if len(sets) == len(alts) and sum(len(a) for a in sets) <= _MAX_ALTERNATIVES:
                found.append(set().union(*sets))
    if run != {""}:
        found.append(run)
    return found


def _best(candidates: list[set[str]]) -> set[str] | None:
    """The most selective candidate set: longest shortest string, then fewest."""
    usable = [c for c in candidates if c and min(map(len, c)) >= 3]
    if not usable:
        return None
    return max(usable, key=lambda c: (min(map(len, c)), -len(c)))
