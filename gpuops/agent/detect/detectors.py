"""Quiet-failure detectors: figures in, findings out, on an injected clock.

A run that fell back to slow eager mode prints nothing fatal. From outside it shows (REFERENCE.md,
H200): throughput 5x lower, GPU memory at another steady level (or swinging, with some allocator
settings), and, when the warmup missed a shape, new inductor cache files or ``Recompiling
function`` lines after training started. The watchdog feeds what it measured (``throughput``,
``sample``, ``cache_files``, ``recompile``) and asks ``judge(t)`` for new findings.

Each rule reports once per episode and re-arms only after a full window back in range. The level
rules (throughput-drop, gpu-memory-shift) need a baseline (an earlier comparable good run's profile,
or numbers in the playbook); without one they are replaced by one ``no-baseline`` note saying why.

throughput-drop judges the median of the window's figures, or of the last MIN_FIGURES figures when a
slowdown left fewer in the window (5x slower is 5x fewer step lines), and the rate of figures against
the baseline's: step lines far rarer than the good run's are a drop too, unless their spacing is the
good run's (a periodic eval pause leaves one long gap, not rarer steps). gpu-memory-volatile is
repeated swings (SWINGS moves of more than max_swing_mib within the window, as the eager fallback's
per-step allocations make) or a jump to a new level held for half a window; never one excursion
that comes back (a checkpoint holding +3 GiB for 2 s), also once its way out has left the window
(the window before it is looked at too).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from .episodes import Episode, in_window, keep, moves
from ..wire.signatures.rules import GUARD_HOWTO
from ..wire.smi import GpuSample
from ..wire.watchfile import DETECTOR_DEFAULTS
from .throughput import median

__all__ = [
    "ABORT", "DEFAULTS", "NOTE", "WARN", "Baseline", "Detectors", "Finding", "RECOMPILE_MARK", "RULES", "resolve",
]

THROUGHPUT_DROP = "throughput-drop"
MEMORY_SHIFT = "gpu-memory-shift"
MEMORY_VOLATILE = "gpu-memory-volatile"
COMPILE_AFTER_WARMUP = "compile-after-warmup"
NO_BASELINE = "no-baseline"  # note: the level rules cannot judge this run
NO_THROUGHPUT = "no-throughput"  # note: no throughput figure to judge
CACHE_SHARED = "cache-shared"  # note: another run writes to this run's inductor cache
RULES = (THROUGHPUT_DROP, MEMORY_SHIFT, MEMORY_VOLATILE, COMPILE_AFTER_WARMUP, NO_BASELINE, NO_THROUGHPUT, CACHE_SHARED)
ABORT, WARN, NOTE = "abort", "warn", "note"

DEFAULTS = DETECTOR_DEFAULTS  # the playbook keys' defaults, spelled once in watch.json's module
MIN_FIGURES = 3  # a median of fewer figures is noise
SWINGS = 3  # moves beyond max_swing_mib within a window that make memory volatile (one excursion is two)
RECOMPILE_MARK = "Recompiling function"  # TORCH_LOGS=recompiles, torch 2.11
_RECOMPILED = re.compile(RECOMPILE_MARK + r" (\S+)")

EAGER_ADVICE = (
    "likely the eager fallback, the FX thread-safety race's slow path (a thread fell back to eager mode, "
    "the process runs on): " + GUARD_HOWTO + "; or compile each device's function under one lock before the "
    "threads start and warm every shape")
LOWER_ADVICE = (
    "less memory than the good run: a worker thread may have died (the FX race kills a drafter thread "
    "while the process runs on; look for 'Exception in thread') or the batch shrank")
COMPILE_ADVICE = (
    "the warmup did not cover a shape this run uses, so training compiles it now (slow, and in threads "
    "it risks the FX race): warm every shape on every device under one lock before the threads start, "
    "or mark the dimension dynamic; meanwhile " + GUARD_HOWTO)


def resolve(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config with every enabled section's missing keys filled from DEFAULTS."""
    out: Dict[str, Any] = {"sample_interval": float(config.get("sample_interval") or DEFAULTS["sample_interval"])}
    for key in ("throughput", "gpu_memory", "compile_after_warmup"):
        section = config.get(key)
        out[key] = None if section is None else {**DEFAULTS[key], **section}
    return out


@dataclass(frozen=True)
class Baseline:
    """What a good run measured: its steady throughput and per-GPU memory level (MiB)."""

    run: Optional[str]
    throughput: Optional[float]
    gpu_memory: Optional[Dict[int, float]]
    source: str  # "last" (an earlier run's profile) | "playbook" | "playbook+last"
    figure_rate: Optional[float] = None  # throughput figures a second in its steady part (step lines)


@dataclass(frozen=True)
class Finding:
    """One detector's verdict: what was measured against what, what it likely means, what to do."""

    rule: str
    action: str
    message: str
    advice: str
    figures: Dict[str, Any]

    def as_json(self) -> Dict[str, Any]:
        return asdict(self)


class Detectors:
    """The quiet-failure rules of one run (see the module docstring); `started` is when training started."""

    def __init__(self, config: Dict[str, Any], baseline: Optional[Baseline], started: float,
                 no_baseline: Optional[str] = None) -> None:
        self.config = resolve(config)
        self.baseline = baseline
        self.no_baseline = no_baseline  # why there is no earlier run to judge against (said in the note)
        self.started = started
        self._figures: Deque[Tuple[float, float]] = deque(maxlen=100_000)
        self._last_figures: Deque[float] = deque(maxlen=MIN_FIGURES)  # after settle, however old
        self._steady = (0, None, None)  # type: Tuple[int, Optional[float], Optional[float]]
        self._memory: Dict[int, Deque[Tuple[float, float]]] = {}
        self._episodes: Dict[Tuple[str, Optional[int]], Episode] = {}
        self._noted: Set[str] = set()
        self._cache = (0, [])  # type: Tuple[int, List[str]]
        self._cache_acked = 0  # files already accounted for: those of settle, and those reported
        self._recompiles: List[Tuple[float, str]] = []
        self._notes: List[Finding] = []  # said at the next judge()
        windows = [s["window"] for s in (self.config["throughput"], self.config["gpu_memory"]) if s is not None]
        rate = baseline.figure_rate if baseline is not None else None
        if rate and self.config["throughput"] is not None:
            windows.append(self._rate_span(self.config["throughput"], rate))
        self._horizon = 2.0 * max(windows, default=0.0) + 10.0

    # -- what the watchdog measured ------------------------------------------------------------
    def throughput(self, t: float, value: float) -> None:
        """A throughput figure read from the log at t."""
        self._figures.append((t, float(value)))
        keep(self._figures, t, self._horizon)
        cfg = self.config["throughput"]
        if cfg is not None and t >= self.started + cfg["settle"]:
            self._last_figures.append(float(value))
            n, first, _ = self._steady
            self._steady = (n + 1, t if first is None else first, t)

    def figure_rate(self) -> Optional[float]:
        """Throughput figures a second since settle (what a later run's step-line rate is judged by)."""
        n, first, last = self._steady
        return None if n < MIN_FIGURES or first is None or last is None or last <= first else (n - 1) / (last - first)

    def sample(self, t: float, gpus: GpuSample) -> None:
        """One nvidia-smi sample of the run's GPUs."""
        for gpu, (memory, _util) in gpus.items():
            points = self._memory.setdefault(gpu, deque(maxlen=10_000))
            if memory is not None:
                points.append((t, float(memory)))
            keep(points, t, self._horizon)

    def cache_files(self, t: float, new: int, examples: List[str]) -> None:
        """New inductor cache files since the snapshot at training start (CacheWatcher.new_files)."""
        section = self.config["compile_after_warmup"]
        self._cache = (new, list(examples))
        if section is not None and t < self.started + section["settle"]:
            self._cache_acked = new  # the run's own start-up may still write to the cache

    def unaccounted(self, new: int) -> bool:
        """Whether a walk's count of new cache files holds files not yet accounted for."""
        return new > self._cache_acked

    def cache_shared(self, t: float, runs: List[str], cache_dir: str) -> None:
        """The cache's new files may be other runs' (cacheshare.py): the snapshot took them in, counting starts over."""
        self._cache, self._cache_acked = (0, []), 0
        section = self.config["compile_after_warmup"]
        if section is None or CACHE_SHARED in self._noted:
            return
        self._noted.add(CACHE_SHARED)
        message = "run %s shares this run's inductor cache %s: files new in it while %s alive are not counted" % (
            ", ".join(runs), cache_dir, "it is" if len(runs) == 1 else "they are")
        advice = ("give each concurrent playbook its own TORCHINDUCTOR_CACHE_DIR (warmup and training of a run "
                  "share it), or set watch.recompiles: true: this run's own Recompiling function lines still count")
        self._notes.append(Finding(CACHE_SHARED, NOTE, message, advice, {"runs": runs, "cache_dir": cache_dir,
                                                                          "gpu": None}))

    def recompile(self, t: float, line: str) -> None:
        """A log line; `Recompiling function` lines after settle mean a shape the warmup missed."""
        match = _RECOMPILED.search(line)
        section = self.config["compile_after_warmup"]
        if match and section is not None and t >= self.started + section["settle"] and len(self._recompiles) < 1000:
            self._recompiles.append((t, match.group(1)))  # judge() takes them; the cap bounds a judge that never comes

    # -- verdicts ------------------------------------------------------------------------------
    def judge(self, t: float) -> List[Finding]:
        """The findings that begin at t (each rule once per episode)."""
        found, self._notes = self._notes, []
        found += self._note_missing_baseline(t)
        found += self._judge_throughput(t)
        found += self._judge_memory(t)
        found += self._judge_compile(t)
        return found

    def _episode(self, rule: str, gpu: Optional[int], window: float) -> Episode:
        return self._episodes.setdefault((rule, gpu), Episode(window))

    def _base(self) -> Dict[str, Any]:
        b = self.baseline
        return {"baseline_run": b.run if b else None, "baseline_source": b.source if b else None}

    def _note_missing_baseline(self, t: float) -> List[Finding]:
        tp, mem = self.config["throughput"], self.config["gpu_memory"]
        settle = min(s["settle"] for s in (tp, mem) if s is not None) if (tp or mem) else 0.0
        if NO_BASELINE in self._noted or not (tp or mem) or t < self.started + settle:
            return []
        self._noted.add(NO_BASELINE)
        b = self.baseline
        missing = []
        if tp is not None and (b is None or b.throughput is None):
            missing.append("throughput")
        levels = (b.gpu_memory or {}) if b else {}
        gpus = sorted(g for g in self._memory if g not in levels)
        if mem is not None and not levels:
            missing.append("GPU memory")
        elif mem is not None and gpus:
            missing.append("GPU memory of GPU %s" % ", ".join(map(str, gpus)))
        if not missing:
            return []
        why = self.no_baseline if b is None or b.source == "playbook" else None
        message = "no %s for %s: not judged against an earlier run" % (
            "comparable baseline" if why else "baseline", " or ".join(missing)) + ("; " + why if why else "")
        advice = ("the next run of this playbook with the same command, env, workdir and GPUs that succeeds without findings "
                  "sets it (or give a number as baseline:); memory volatility and compile-after-warmup still "
                  "judge this run")
        figures = {"missing": missing, "gpus": gpus, "why": why, **self._base()}
        return [Finding(NO_BASELINE, NOTE, message, advice, figures)]

    def _judge_throughput(self, t: float) -> List[Finding]:
        cfg, b = self.config["throughput"], self.baseline
        if cfg is None or t < self.started + cfg["settle"]:
            return []
        window = cfg["window"]
        values = in_window(self._figures, max(t - window, self.started + cfg["settle"]), t)
        over = "the last %g s" % window
        if len(values) < MIN_FIGURES:  # a slowdown leaves fewer figures a window: judge the last ones
            values, over = list(self._last_figures), "its last %d figures" % len(self._last_figures)
        measured = median(values) if len(values) >= MIN_FIGURES else None
        rate = self._rate(t, cfg)
        found = self._note_no_figures(t, cfg)
        if b is None or not b.throughput:
            return found
        slow = None if measured is None else measured < cfg["min_ratio"] * b.throughput
        rare = None if rate is None else rate[0] < cfg["min_ratio"] * rate[1]
        if rare and rate is not None and (self._pace(t, cfg) or 0.0) >= cfg["min_ratio"] * rate[1]:
            rare = False  # the figures come as often as the baseline's when they come: a pause (an eval), not slow steps
        bad = None if slow is None and rare is None else bool(slow or rare)
        began = self._episode(THROUGHPUT_DROP, None, window).starts(t, bad)
        if not began:
            return found
        what = []
        if slow and measured is not None:
            what.append("throughput %s/s over %s is %.2fx the baseline %s/s" % (
                _n(measured), over, measured / b.throughput, _n(b.throughput)))
        if rare and rate is not None:
            what.append("%.3g throughput figures a second over the last %g s is %.2fx the baseline's %.3g "
                        "(fewer step lines: slower steps)" % (rate[0], rate[2], rate[0] / rate[1], rate[1]))
        ratio = measured / b.throughput if slow and measured is not None else rate[0] / rate[1] if rate else 1.0
        message = "; ".join(what) + " (run %s)" % (b.run or b.source)
        figures = {"measured": measured, "baseline": b.throughput, "ratio": round(ratio, 4), "gpu": None,
                   "window": window, "n": len(values), "min_ratio": cfg["min_ratio"],
                   "figure_rate": None if rate is None else round(rate[0], 6),
                   "baseline_figure_rate": None if rate is None else round(rate[1], 6), **self._base()}
        return found + [Finding(THROUGHPUT_DROP, cfg["action"], message, EAGER_ADVICE, figures)]

    @staticmethod
    def _rate_span(cfg: Dict[str, Any], base: float) -> float:
        """The span a figure rate is counted over: a window, or long enough to expect MIN_FIGURES figures."""
        return max(cfg["window"], MIN_FIGURES / base)

    def _rate(self, t: float, cfg: Dict[str, Any]) -> Optional[Tuple[float, float, float]]:
        """(figures a second now, the baseline's, over how many seconds), once a whole span is past settle."""
        base = self.baseline.figure_rate if self.baseline is not None else None
        if not base or base <= 0 or self._steady[0] == 0:  # no figure at all is a pattern to check, not a rate
            return None
        span = self._rate_span(cfg, base)
        if t < self.started + cfg["settle"] + span:
            return None
        return len(in_window(self._figures, t - span, t)) / span, base, span

    def _pace(self, t: float, cfg: Dict[str, Any]) -> Optional[float]:
        """Figures a second as their spacing says: the median gap between the last few since settle (None
        with fewer than two). A pause leaves one long gap, slower steps make every gap long."""
        since, times = self.started + cfg["settle"], []  # type: float, List[float]
        for at, _ in reversed(self._figures):
            if at > t:
                continue
            if at < since or len(times) > MIN_FIGURES:
                break
            times.append(at)
        gaps = [a - b for a, b in zip(times, times[1:])]
        gap = median(gaps) if gaps else 0.0
        return 1.0 / gap if gap > 0 else None

    def _note_no_figures(self, t: float, cfg: Dict[str, Any]) -> List[Finding]:
        """Once: not one figure a window past settle (a pattern that matches nothing); a few are waited for."""
        if self._steady[0] or t < self.started + cfg["settle"] + cfg["window"] or NO_THROUGHPUT in self._noted:
            return []
        self._noted.add(NO_THROUGHPUT)
        message = "no throughput figure in the %g s since settle: throughput-drop judges %d or more" % (
            t - self.started - cfg["settle"], MIN_FIGURES)
        advice = "check throughput.pattern against the log (its first group is the figure)"
        figures = {"n": 0, "window": cfg["window"], "pattern": cfg.get("pattern")}
        return [Finding(NO_THROUGHPUT, NOTE, message, advice, figures)]

    def _judge_memory(self, t: float) -> List[Finding]:
        cfg = self.config["gpu_memory"]
        if cfg is None or t < self.started + cfg["settle"]:
            return []
        found: List[Finding] = []
        since = self.started + cfg["settle"]
        lo, before = max(t - cfg["window"], since), max(t - 2 * cfg["window"], since)
        for gpu in sorted(self._memory):
            wider = [(at, v) for at, v in self._memory[gpu] if before < at <= t]
            points = [(at, v) for at, v in wider if at > lo]
            values = [v for _, v in points]
            found += self._shift(t, cfg, gpu, values) + self._volatile(t, cfg, gpu, points, wider)
        return found

    def _shift(self, t: float, cfg: Dict[str, Any], gpu: int, values: List[float]) -> List[Finding]:
        level = ((self.baseline.gpu_memory or {}) if self.baseline else {}).get(gpu)
        if not level or level <= 0:
            return []
        measured = median(values) if len(values) >= MIN_FIGURES else None
        ratio = None if measured is None else measured / level
        bad = None if ratio is None else not (1.0 / cfg["max_ratio"] <= ratio <= cfg["max_ratio"])
        began = self._episode(MEMORY_SHIFT, gpu, cfg["window"]).starts(t, bad)
        if not began or ratio is None or measured is None:
            return []
        assert self.baseline is not None  # a level came from it
        message = "GPU %d memory %s MiB over the last %g s is %.2fx the baseline %s MiB (run %s)" % (
            gpu, _n(measured), cfg["window"], ratio, _n(level), self.baseline.run or self.baseline.source)
        advice = EAGER_ADVICE if ratio > 1 else LOWER_ADVICE
        figures = {"measured": measured, "baseline": level, "ratio": round(ratio, 4), "gpu": gpu,
                   "window": cfg["window"], "n": len(values), "max_ratio": cfg["max_ratio"], **self._base()}
        return [Finding(MEMORY_SHIFT, cfg["action"], message, advice, figures)]

    def _volatile(self, t: float, cfg: Dict[str, Any], gpu: int, points: List[Tuple[float, float]],
                  wider: List[Tuple[float, float]]) -> List[Finding]:
        values = [v for _, v in points]
        turns = moves(points, cfg["max_swing_mib"]) if len(points) >= MIN_FIGURES else None
        # one move whose new level held for half a window (and the old one a quarter before it) is a jump,
        # unless it is the way back of an excursion whose way out has just left the window (the window
        # before it holds that one other move): a return to the old level is no new one
        jump = bool(turns) and len(turns) == 1 and t - turns[0] >= cfg["window"] / 2 and (
            turns[0] - points[0][0] >= cfg["window"] / 4) and len(moves(wider, cfg["max_swing_mib"])) != 2
        bad = None if turns is None else len(turns) >= SWINGS or jump
        began = self._episode(MEMORY_VOLATILE, gpu, cfg["window"]).starts(t, bad)
        if not began or turns is None:
            return []
        swing = max(values) - min(values)
        if jump:
            how = "jumped from %s to %s MiB and stayed" % (_n(values[0]), _n(values[-1]))
        else:
            how = "swung %d times by more than %s MiB" % (len(turns), _n(cfg["max_swing_mib"]))
        message = "GPU %d memory %s within the last %g s (%s-%s MiB), now %s MiB" % (
            gpu, how, cfg["window"], _n(min(values)), _n(max(values)), _n(values[-1]))
        advice = ("memory that swings by GBs each step, or jumps to a new level mid-run, is eager code allocating "
                  "per step (empty_cache, expandable_segments) or the switch to the eager fallback: " + EAGER_ADVICE)
        figures = {"measured": swing, "min": min(values), "max": max(values), "first": values[0], "last": values[-1],
                   "swings": len(turns), "kind": "jump" if jump else "swings",
                   "gpu": gpu, "window": cfg["window"], "n": len(values), "max_swing_mib": cfg["max_swing_mib"],
                   "baseline": None, "ratio": None, **self._base()}
        return [Finding(MEMORY_VOLATILE, cfg["action"], message, advice, figures)]

    def _judge_compile(self, t: float) -> List[Finding]:
        cfg = self.config["compile_after_warmup"]
        if cfg is None or t < self.started + cfg["settle"]:
            return []
        count, examples = self._cache
        new_files, lines = count - self._cache_acked, self._recompiles
        self._cache_acked, self._recompiles = count, []
        if not self._episode(COMPILE_AFTER_WARMUP, None, cfg["window"]).starts(t, new_files > 0 or bool(lines)):
            return []
        functions = sorted({name for _, name in lines})
        what = []
        if new_files > 0:
            what.append("%d new inductor cache file(s) after warmup (%s)" % (new_files, ", ".join(examples[:3])))
        if lines:
            what.append("dynamo recompiled %s (%d time(s))" % (", ".join(functions), len(lines)))
        figures = {"measured": new_files, "files_since_start": count, "examples": examples[:5],
                   "recompiles": len(lines), "functions": functions, "settle": cfg["settle"], "gpu": None,
                   "window": cfg["window"], "baseline": None, "ratio": None, "baseline_run": None}
        return [Finding(COMPILE_AFTER_WARMUP, cfg["action"], "; ".join(what), COMPILE_ADVICE, figures)]


def _n(value: float) -> str:
    """A figure for a message: thousands separated, no decimals."""
    return "{:,.0f}".format(value)
