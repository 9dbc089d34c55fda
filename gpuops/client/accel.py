"""Optional hyperscan accelerator for the signature matcher (``pip install gpuops[fast]``).

``matcher(rules, ...)`` returns a Matcher whose search for trigger literals runs
in hyperscan when the ``hyperscan`` package imports and works on this CPU, else
the standard-library Matcher. The hits are the same either way.

The Matcher still makes its one translate pass per chunk (the line count, and the
literals it finds through a byte rare in the log); hyperscan finds the others, all
of them in one pass with the GIL released, where the standard library needs one
``bytes.find`` pass per literal: the more playbook rules, the more it saves. This
module only compiles literals and reports where they are.
"""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from typing import Sequence

from gpuops.agent.wire.signatures.matcher import Finder, Matcher, Rule

__all__ = ["available", "hyperscan_prefilter", "matcher"]


@lru_cache(maxsize=1)
def _hyperscan() -> ModuleType | None:
    try:
        import hyperscan

        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(expressions=[b"gpuops"], ids=[0], elements=1, flags=0, literal=True)
    except Exception:  # not installed, or a build or CPU it does not support: the stdlib search is used
        return None
    return hyperscan


def available() -> bool:
    """Whether hyperscan imports and compiles here (checked once per process)."""
    return _hyperscan() is not None


def matcher(rules: Sequence[Rule], *, start_offset: int = 0, max_line: int = 65536) -> Matcher:
    """A Matcher for ``rules``, its literal search in hyperscan when available."""
    prefilter = hyperscan_prefilter if available() else None
    return Matcher(rules, start_offset=start_offset, max_line=max_line, prefilter=prefilter)


def hyperscan_prefilter(sets: tuple[tuple[bytes, ...], ...]) -> Finder:
    """Compile literal sets into one hyperscan database (a Matcher's ``prefilter``)."""
    hs = _hyperscan()
    if hs is None:
        raise RuntimeError("hyperscan is not available: pip install 'gpuops[fast]'")
    return _HyperscanFinder(hs, sets)


class _HyperscanFinder:
    """Block-mode scan of a chunk for all literals; a match is reported by its end, so
    its start is the end less the literal's length (no start-of-match tracking)."""

    def __init__(self, hs: ModuleType, sets: tuple[tuple[bytes, ...], ...]) -> None:
        literals = [lit for lits in sets for lit in lits]
        self._set = tuple(i for i, lits in enumerate(sets) for _ in lits)
        self._len = tuple(map(len, literals))
        self._db = None
        if literals:  # hyperscan refuses an empty database
            self._db = hs.Database(mode=hs.HS_MODE_BLOCK)
            self._db.compile(
                expressions=literals, ids=list(range(len(literals))), elements=len(literals), flags=0, literal=True
            )

    def __call__(self, data: bytes, start: int, end: int) -> list[tuple[int, int]]:
        """(position, set index) of every literal occurrence in data[start:end]."""
        found: list[tuple[int, int]] = []
        if self._db is None or start >= end:
            return found
        append, sets, lens = found.append, self._set, self._len

        def on_match(literal: int, _from: int, to: int, _flags: int, _context: object) -> None:
            append((start + to - lens[literal], sets[literal]))

        self._db.scan(memoryview(data)[start:end], match_event_handler=on_match)
        return found
