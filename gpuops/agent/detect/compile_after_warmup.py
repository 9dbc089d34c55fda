"""compile-after-warmup (watch.compile_after_warmup): training compiles after its warmup.

When the warmup missed a shape, training compiles it: new files appear in the inductor cache after
settle, or torch logs `Recompiling function` (TORCH_LOGS=recompiles, watch.recompiles: true). Files
another run may have written (cacheshare.py) are not counted; that is said once (a `cache-shared` note).
"""

from __future__ import annotations

import re
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ..wire.builtin_rules import GUARD_HOWTO
from . import judge
from .cachewatch import inductor_cache_dir
from .episodes import Episode
from .judge import NOTE, Finding

COMPILE_AFTER_WARMUP = "compile-after-warmup"
CACHE_SHARED = "cache-shared"  # note: another run writes to this run's inductor cache
#: The metric rule that reads torch's line (REFERENCE.md): "[__recompiles] Recompiling function NAME in FILE".
RECOMPILES = "recompiles"
RECOMPILE_MARK = "Recompiling function"  # TORCH_LOGS=recompiles, torch 2.11
RECOMPILE_PATTERN = RECOMPILE_MARK + r" \S+"
_RECOMPILED = re.compile(RECOMPILE_MARK + r" (\S+)")
#: Seconds of no compile after an episode before it reports again.
WINDOW = 60.0

COMPILE_ADVICE = (
    "the warmup did not cover a shape this run uses, so training compiles it now (slow, and in threads "
    "it risks the FX race): warm every shape on every device under one lock before the threads start, "
    "or mark the dimension dynamic; meanwhile " + GUARD_HOWTO)


class Detector(judge.Detector):
    """New inductor cache files, and Recompiling function lines, after settle."""

    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self._cache = (0, [])  # type: Tuple[int, List[str]]
        self._acked = 0  # files already accounted for: those of settle, and those reported
        self._recompiles: List[Tuple[float, str]] = []
        self._episode = Episode(WINDOW)
        self._noted = False

    @classmethod
    def metrics(cls, settings: Any) -> Sequence[Tuple[str, str]]:
        return ((RECOMPILES, RECOMPILE_PATTERN),)

    def cache_dir(self, env: Mapping[str, str]) -> Optional[str]:
        return str(self.settings.cache_dir or inductor_cache_dir(env))

    def measure(self, t: float, name: str, value: str) -> None:
        """A `Recompiling function` line after settle means a shape the warmup missed."""
        match = _RECOMPILED.search(value) if name == RECOMPILES else None
        if match and t >= self.run.started + self.settings.settle and len(self._recompiles) < 1000:
            self._recompiles.append((t, match.group(1)))  # judge() takes them; the cap bounds a judge that never comes

    def cache_files(self, t: float, new: int, examples: List[str]) -> None:
        self._cache = (new, list(examples))
        if t < self.run.started + self.settings.settle:
            self._acked = new  # the run's own start-up may still write to the cache

    def unaccounted(self, new: int) -> bool:
        return new > self._acked

    def cache_shared(self, t: float, runs: List[str], cache_dir: str) -> None:
        self._cache, self._acked = (0, []), 0
        if self._noted:
            return
        self._noted = True
        message = "run %s shares this run's inductor cache %s: files new in it while %s alive are not counted" % (
            ", ".join(runs), cache_dir, "it is" if len(runs) == 1 else "they are")
        advice = ("give each concurrent playbook its own TORCHINDUCTOR_CACHE_DIR (warmup and training of a run "
                  "share it), or set watch.recompiles: true: this run's own Recompiling function lines still count")
        self.notes.append(Finding(CACHE_SHARED, NOTE, message, advice, {"runs": runs, "cache_dir": cache_dir,
                                                                         "gpu": None}))

    def judge(self, t: float) -> List[Finding]:
        cfg = self.settings
        if t < self.run.started + cfg.settle:
            return []
        count, examples = self._cache
        new_files, lines = count - self._acked, self._recompiles
        self._acked, self._recompiles = count, []
        if not self._episode.starts(t, new_files > 0 or bool(lines)):
            return []
        functions = sorted({name for _, name in lines})
        what = []
        if new_files > 0:
            what.append("%d new inductor cache file(s) after warmup (%s)" % (new_files, ", ".join(examples[:3])))
        if lines:
            what.append("dynamo recompiled %s (%d time(s))" % (", ".join(functions), len(lines)))
        figures = {"measured": new_files, "files_since_start": count, "examples": examples[:5],
                   "recompiles": len(lines), "functions": functions, "settle": cfg.settle, "gpu": None,
                   "window": WINDOW, "baseline": None, "ratio": None, "baseline_run": None}
        return [Finding(COMPILE_AFTER_WARMUP, cfg.action, "; ".join(what), COMPILE_ADVICE, figures)]
