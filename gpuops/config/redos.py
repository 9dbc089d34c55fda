"""Regular expressions a backtracking matcher can take exponential time on, found before a run starts.

Python's `re` backtracks: when a repeated part can match the same text in two ways (`(a+)+`,
`(\\w+\\s?)*`, `(a|a)*`), a line that almost matches costs 2^n attempts. That is exponential
ambiguity of the pattern's NFA (Weideman et al., 2016): a state with two different paths back to
itself over the same text. We build a Thompson NFA from the stdlib parser's tree (character
classes as bit sets over a sample alphabet), pair it with itself, and look for a strongly
connected component that holds a state pair (q, q) and a step where the two paths differ. A loop
that can end the match whenever it stops (nothing that can fail after it) is harmless, so it is
not reported. Polynomial cases (`.*a.*b`) are not reported: they are everywhere and bounded by the
line length. When unsure (a pattern too large to analyse), say nothing.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Callable

if sys.version_info >= (3, 11):
    from re import _constants as _c
    from re import _parser as _p
else:  # Python 3.10
    import sre_constants as _c
    import sre_parse as _p

__all__ = ["risky"]

_UNROLL = 6  # a{m,n}: at most this many copies of a repeated part; more is read as unbounded
_MAX_STATES = 160  # character positions; a larger pattern is not analysed
_MAX_STEPS = 200_000  # work on epsilon paths and state pairs before giving up
_REPEATS = tuple(getattr(_c, n) for n in ("MAX_REPEAT", "MIN_REPEAT") if hasattr(_c, n))
_OPAQUE = tuple(getattr(_c, n) for n in ("POSSESSIVE_REPEAT", "ATOMIC_GROUP") if hasattr(_c, n))
_SAMPLES = "\u00a0\u00e9\u00df\u0130\u0131\u017f\u0660\u0663\u2028\u2029\u3000\u4e2d\u212a\uff10\U0001f600"
_CATEGORIES = {
    "CATEGORY_DIGIT": r"\d", "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_SPACE": r"\s", "CATEGORY_NOT_SPACE": r"\S",
    "CATEGORY_WORD": r"\w", "CATEGORY_NOT_WORD": r"\W", "CATEGORY_LINEBREAK": r"\n", "CATEGORY_NOT_LINEBREAK": r"[^\n]",
}


class _TooBig(Exception):
    """The pattern is beyond what we analyse: report nothing."""


def risky(pattern: str) -> str | None:
    """Why `pattern` can backtrack catastrophically on a line, or None (also when unsure)."""
    try:
        tree = _p.parse(pattern)
        flags = tree.state.flags
        nfa = _Nfa(flags)
        nfa.accept = nfa.build(tree, nfa.start, flags)
        if not nfa.harmful_loop():
            return None
        return _culprit(pattern, flags)
    except (_TooBig, RecursionError):
        return None
    except Exception:  # the stdlib's internal parser: its tree may change shape between versions
        return None


def _culprit(pattern: str, flags: int) -> str:
    """Name the innermost repeated group that is ambiguous on its own, as the user wrote it."""
    for text in _looping_groups(pattern):
        try:
            tree = _p.parse(text, flags)
            nfa = _Nfa(flags)
            nfa.accept = nfa.build(tree, nfa.start, flags)
            if not nfa.ambiguous_states():
                continue
        except (_TooBig, RecursionError):
            continue
        except Exception:  # a fragment that does not parse alone (a backreference, a verbose comment)
            continue
        ops = [op for op, _ in _walk(tree)]
        if sum(1 for op, av in _walk(tree) if op in _REPEATS and av[1] - av[0] > _UNROLL) > 1:
            return f"{text} nests a repeat in a repeat, which can split the same text in many ways"
        if _c.BRANCH in ops:
            return f"{text} repeats alternatives that can match the same text"
        return f"{text} can match the same text in many ways"
    return "a repeated part can match the same text in many ways"


_QUANTIFIER = re.compile(r"(?:[*+]|\{\d*,\d*\})[?+]?")


def _looping_groups(pattern: str) -> list[str]:
    """Each group followed by * + or {m,n}, as written, innermost first."""
    found: list[str] = []
    opens: list[int] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 1
        elif in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 1 + pattern.startswith("^", i + 1)  # a ']' first in a class is a literal
            if pattern.startswith("]", i):
                i += 1
            continue
        elif c == "(":
            opens.append(i)
        elif c == ")" and opens:
            begin = opens.pop()
            quantifier = _QUANTIFIER.match(pattern, i + 1)
            if quantifier:
                found.append(pattern[begin : quantifier.end()])
        i += 1
    return found


def _walk(items: Any) -> Any:
    """Every (op, av) in a parsed tree, depth first."""
    for op, av in items:
        yield op, av
        for child in _children(op, av):
            yield from _walk(child)


def _children(op: Any, av: Any) -> list[Any]:
    if op is _c.SUBPATTERN:
        return [av[-1]]
    if op in _REPEATS or op in _OPAQUE:
        return [av[-1] if isinstance(av, tuple) else av]  # an atomic group's av is its body
    if op is _c.BRANCH:
        return list(av[1])
    if op is _c.GROUPREF_EXISTS:
        return [x for x in av[1:] if x is not None]
    if op in (_c.ASSERT, _c.ASSERT_NOT):
        return [av[1]]
    return []


class _Nfa:
    """A Thompson NFA: epsilon states and character states, each character state one class."""

    def __init__(self, flags: int) -> None:
        self.eps: list[list[int]] = []
        self.guard: set[int] = set()  # anchors, lookarounds, backreferences: the match cannot end through them
        self.preds: dict[int, Callable[[str], bool]] = {}
        self.after: dict[int, int] = {}
        self.literals: set[str] = set()
        self.flags = flags
        self.start = self.new()
        self.accept = self.start

    def new(self) -> int:
        self.eps.append([])
        return len(self.eps) - 1

    def char(self, start: int, pred: Callable[[str], bool]) -> int:
        if len(self.preds) >= _MAX_STATES:
            raise _TooBig
        state, end = self.new(), self.new()
        self.eps[start].append(state)
        self.preds[state] = pred
        self.after[state] = end
        return end

    def build(self, items: Any, start: int, flags: int) -> int:
        """Add the fragment for a parsed sequence from `start`; return its end state."""
        cur = start
        for op, av in items:
            cur = self.item(op, av, cur, flags)
        return cur

    def item(self, op: Any, av: Any, cur: int, flags: int) -> int:
        if op is _c.SUBPATTERN:
            return self.build(av[-1], cur, (flags | av[1]) & ~av[2])
        if op is _c.BRANCH:
            return self.alternatives(list(av[1]), cur, flags)
        if op is _c.GROUPREF_EXISTS:
            return self.alternatives([x if x is not None else [] for x in av[1:]], cur, flags)
        if op in _REPEATS:
            return self.repeat(av[2], av[0], av[1], cur, flags)
        if op in _OPAQUE:  # no backtracking into it: one token that matches only itself
            return self.char(cur, lambda ch: False)
        if op in (_c.AT, _c.ASSERT, _c.ASSERT_NOT, _c.GROUPREF):  # read as epsilon, but it can fail
            check, end = self.new(), self.new()
            self.eps[cur].append(check)
            self.eps[check].append(end)
            self.guard.add(check)
            return end
        return self.char(cur, self.predicate(op, av, flags))

    def alternatives(self, alts: list[Any], cur: int, flags: int) -> int:
        end = self.new()
        for alt in alts:
            begin = self.new()
            self.eps[cur].append(begin)
            self.eps[self.build(alt, begin, flags)].append(end)
        return end

    def repeat(self, body: Any, lo: int, hi: int, cur: int, flags: int) -> int:
        """x{lo,hi}: lo copies, then a loop (E -> body -> L -> body | X) or nested optional copies."""
        for _ in range(min(lo, _UNROLL)):
            cur = self.build(body, cur, flags)
        end = self.new()
        if hi - lo > _UNROLL:
            begin, loop = self.new(), self.new()
            self.eps[cur] += [begin, end]
            self.eps[self.build(body, begin, flags)].append(loop)
            self.eps[loop] += [begin, end]
            return end
        for _ in range(hi - lo):
            begin = self.new()
            self.eps[cur] += [begin, end]
            cur = self.build(body, begin, flags)
        self.eps[cur].append(end)
        return end

    def predicate(self, op: Any, av: Any, flags: int) -> Callable[[str], bool]:
        """Which characters one parsed item matches."""
        fold = bool(flags & re.IGNORECASE)
        ascii_only = bool(flags & re.ASCII)
        if op is _c.LITERAL:
            self.literals.add(chr(av))
            return _in_set({chr(av)}, [], False, fold)
        if op is _c.NOT_LITERAL:
            return _in_set({chr(av)}, [], True, fold)
        if op is _c.ANY:
            return (lambda ch: True) if flags & re.DOTALL else (lambda ch: ch != "\n")
        if op is _c.IN:
            chars: set[str] = set()
            tests: list[Callable[[str], bool]] = []
            negate = False
            for sub, value in av:
                if sub is _c.NEGATE:
                    negate = True
                elif sub is _c.LITERAL:
                    chars.add(chr(value))
                    self.literals.add(chr(value))
                elif sub is _c.RANGE:
                    tests.append(_between(value[0], value[1]))
                elif sub is _c.CATEGORY:
                    tests.append(_category(value, ascii_only))
                else:
                    raise _TooBig
            return _in_set(chars, tests, negate, fold)
        if op is _c.CATEGORY:
            return _category(av, ascii_only)
        raise _TooBig

    def masks(self) -> dict[int, int]:
        """Each character state's class as a bit set over the sample alphabet."""
        alphabet = [chr(i) for i in range(256)] + sorted(set(_SAMPLES) | self.literals)
        return {s: sum(1 << i for i, ch in enumerate(alphabet) if pred(ch)) for s, pred in self.preds.items()}

    def steps(self) -> dict[int, dict[int, int]]:
        """p -> {r: the number of distinct epsilon paths (1 or 2+)} from after p to character state r."""
        budget = [_MAX_STEPS]
        out: dict[int, dict[int, int]] = {}
        for p, after in self.after.items():
            counts: dict[int, int] = {}
            self._paths(after, {after}, counts, budget)
            out[p] = counts
        return out

    def _paths(self, state: int, seen: set[int], counts: dict[int, int], budget: list[int]) -> None:
        for nxt in self.eps[state]:
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooBig
            if nxt in self.preds:
                counts[nxt] = min(2, counts.get(nxt, 0) + 1)
            elif nxt not in seen:
                seen.add(nxt)
                self._paths(nxt, seen, counts, budget)
                seen.discard(nxt)

    def ambiguous_states(self) -> set[int]:
        """Character states on a loop that two different paths take over the same text."""
        masks, steps = self.masks(), self.steps()
        return _ambiguous(masks, steps)

    def harmful_loop(self) -> bool:
        """An ambiguous loop after which something can still fail (so backtracking explores it)."""
        states = self.ambiguous_states()
        free = self._free()
        return any(self.after[q] not in free for q in states)

    def _free(self) -> set[int]:
        """States from which the match can end without reading or checking anything."""
        free = {self.accept}
        changed = True
        while changed:
            changed = False
            for state, targets in enumerate(self.eps):
                if state not in free and state not in self.guard and any(t in free for t in targets):
                    free.add(state)
                    changed = True
        return free


def _between(lo: int, hi: int) -> Callable[[str], bool]:
    return lambda ch: lo <= ord(ch) <= hi


def _in_set(chars: set[str], tests: list[Callable[[str], bool]], negate: bool, fold: bool) -> Callable[[str], bool]:
    def hit(ch: str) -> bool:
        return ch in chars or any(test(ch) for test in tests)

    def pred(ch: str) -> bool:
        found = hit(ch) or (fold and (hit(ch.lower()) or hit(ch.upper())))
        return found != negate

    return pred


def _category(code: Any, ascii_only: bool) -> Callable[[str], bool]:
    regex = re.compile(_CATEGORIES[_name(code)], re.ASCII if ascii_only else 0)
    return lambda ch: regex.match(ch) is not None


def _name(code: Any) -> str:
    """An opcode's name ('CATEGORY_DIGIT'): the parser's constants are ints with a name."""
    return str(getattr(code, "name", code))


def _ambiguous(masks: dict[int, int], steps: dict[int, dict[int, int]]) -> set[int]:
    """Pair the NFA with itself; an SCC holding some (q, q) and a step where the two paths differ."""
    edges: dict[tuple[int, int], list[tuple[tuple[int, int], bool]]] = {}
    todo = [(q, q) for q in masks]
    budget = _MAX_STEPS
    while todo:
        pair = todo.pop()
        if pair in edges:
            continue
        p, q = pair
        out: list[tuple[tuple[int, int], bool]] = []
        for r, n in steps[p].items():
            for t, m in steps[q].items():
                budget -= 1
                if budget < 0:
                    raise _TooBig
                if masks[r] & masks[t]:
                    out.append(((r, t), p != q or r != t or min(n, m) > 1))
                    todo.append((r, t))
        edges[pair] = out
    found: set[int] = set()
    for component in _components(edges):
        if any(p == q for p, q in component) and any(
            differ and target in component for pair in component for target, differ in edges[pair]
        ):
            found |= {p for p, q in component if p == q}
    return found


def _components(edges: dict[Any, list[tuple[Any, bool]]]) -> list[set[Any]]:
    """Strongly connected components (Tarjan's, iterative: patterns can nest deep)."""
    index: dict[Any, int] = {}
    low: dict[Any, int] = {}
    stack: list[Any] = []
    on_stack: set[Any] = set()
    result: list[set[Any]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = edges[node]
            if i < len(targets):
                work.append((node, i + 1))
                target = targets[i][0]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            for target, _ in targets:
                if target in on_stack:
                    low[node] = min(low[node], low[target])
            if low[node] == index[node]:
                component = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.add(top)
                    if top == node:
                        break
                result.append(component)
    return result
