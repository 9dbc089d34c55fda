"""Quiet-failure detectors: figures in, findings out, on an injected clock.

A run that fell back to slow eager mode prints nothing fatal. From outside it shows (REFERENCE.md,
H200): throughput 5x lower, GPU memory at another steady level (or swinging, with some allocator
settings), and, when the warmup missed a shape, new inductor cache files or ``Recompiling
function`` lines after training started. Each detector is an entry of wire/detector_list.DETECTORS,
judged by its own module here (`load` finds it by the module name its entry gives). The watchdog
feeds what it measured (``measure``, ``sample``, ``cache_files``) to all of them and asks ``judge(t)``
for new findings.

Each rule reports once per episode and re-arms only after a full window back in range. The level
detectors (those with a baseline: throughput-drop, gpu-memory-shift) need one (an earlier comparable
good run's profile, or numbers in the playbook); without one they are replaced by one ``no-baseline``
note saying why.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List, Optional, Set, Tuple, Type

from ..wire.detector_list import DETECTORS, NO_BASELINE, DetectorSettings, DetectorSpec
from ..wire.smi import GpuSample
from . import judge
from .judge import ABORT, MIN_FIGURES, NOTE, WARN, Baseline, Finding, Run, base_figures  # noqa: F401  (their home is judge.py)

__all__ = ["ABORT", "MIN_FIGURES", "NOTE", "WARN", "Baseline", "Detectors", "Finding", "figure_rules", "load"]


def load(spec: DetectorSpec) -> Type[judge.Detector]:
    """The class that judges a detector: `Detector` of gpuops/agent/detect/<spec.module>.py."""
    module = importlib.import_module("." + spec.module, __package__)
    cls: Type[judge.Detector] = module.Detector
    cls.spec = spec
    return cls


def figure_rules(detectors: DetectorSettings) -> List[Tuple[str, str]]:
    """The metric rules the detectors that are on read their figures with: (name, Python regex) pairs, in the
    list's order (the watchdog's matcher runs them after the rules, wire/ruleset.py)."""
    return [pair for spec, settings in detectors.on() for pair in load(spec).metrics(settings)]


class Detectors:
    """The quiet-failure detectors of one run (see the module docstring); `started` is when training started."""

    def __init__(self, detectors: DetectorSettings, baseline: Optional[Baseline], started: float,
                 no_baseline: Optional[str] = None, peers: Any = None) -> None:
        self.baseline = baseline
        self.no_baseline = no_baseline  # why there is no earlier run to judge against (said in the note)
        self.started = started
        on = [(load(spec), settings) for spec, settings in detectors.on()]
        horizon = 2.0 * max((cls.span(settings, baseline) for cls, settings in on), default=0.0) + 10.0
        run = Run(started, baseline, horizon, peers)
        self.judges: List[judge.Detector] = [cls(settings, run) for cls, settings in on]
        self._gpus: Set[int] = set()  # every GPU sampled
        self._noted = False

    # -- what the watchdog measured ------------------------------------------------------------
    def measure(self, t: float, name: str, value: str) -> None:
        """A figure a metric rule read off the log at t (each detector takes the ones it reads)."""
        for d in self.judges:
            d.measure(t, name, value)

    def sample(self, t: float, gpus: GpuSample) -> None:
        """One nvidia-smi sample of the run's GPUs."""
        self._gpus.update(gpus)
        for d in self.judges:
            d.sample(t, gpus)

    def health(self, t: float, sample: Any) -> None:
        """The health fields of the same sample (detect/sampler.HealthSample)."""
        for d in self.judges:
            d.health(t, sample)

    def xid(self, t: float, record: Dict[str, Any]) -> None:
        """An Xid on a GPU of the run, from the host's kernel log."""
        for d in self.judges:
            d.xid(t, record)

    def cache_dir(self, env: Dict[str, str]) -> Optional[str]:
        """The folder whose new files a detector counts (the watchdog walks it), or None."""
        return next((folder for folder in (d.cache_dir(env) for d in self.judges) if folder), None)

    def cache_files(self, t: float, new: int, examples: List[str]) -> None:
        """New files in the cache folder since the snapshot at training start (CacheWatcher.new_files)."""
        for d in self.judges:
            d.cache_files(t, new, examples)

    def unaccounted(self, new: int) -> bool:
        """Whether a walk's count of new cache files holds files not yet accounted for."""
        return any(d.unaccounted(new) for d in self.judges)

    def cache_shared(self, t: float, runs: List[str], cache_dir: str) -> None:
        """The cache's new files may be other runs' (cacheshare.py): the snapshot took them in, counting starts over."""
        for d in self.judges:
            d.cache_shared(t, runs, cache_dir)

    # -- verdicts ------------------------------------------------------------------------------
    def judge(self, t: float) -> List[Finding]:
        """The findings that begin at t (each rule once per episode)."""
        found: List[Finding] = []
        for d in self.judges:
            found, d.notes = found + d.notes, []
        found += self._note_missing_baseline(t)
        for d in self.judges:
            found += d.judge(t)
        return found

    def settle(self) -> Optional[float]:
        """The seconds after the start a level detector leaves out (the profile's steady part), if one judges."""
        settles = [d.settings.settle for d in self.judges if d.spec.baseline]
        return min(settles) if settles else None

    def profile(self) -> Dict[str, Any]:
        """What the detectors add to the run's profile."""
        facts: Dict[str, Any] = {}
        for d in self.judges:
            facts.update(d.profile())
        return facts

    def _note_missing_baseline(self, t: float) -> List[Finding]:
        if self._noted:
            return []
        settle = self.settle()
        if settle is None or t < self.started + settle:
            return []
        self._noted = True
        b = self.baseline
        levels = (b.gpu_memory or {}) if b else {}
        gpus = sorted(g for g in self._gpus if g not in levels)
        missing = [what for d in self.judges if d.spec.baseline for what in d.missing(gpus)]
        if not missing:
            return []
        why = self.no_baseline if b is None or b.source == "playbook" else None
        message = "no %s for %s: not judged against an earlier run" % (
            "comparable baseline" if why else "baseline", " or ".join(missing)) + ("; " + why if why else "")
        advice = ("the next run of this playbook with the same command, env, workdir and GPUs that succeeds without findings "
                  "sets it (or give a number as baseline:); memory volatility and compile-after-warmup still "
                  "judge this run")
        figures = {"missing": missing, "gpus": gpus, "why": why, **base_figures(b)}
        return [Finding(NO_BASELINE, NOTE, message, advice, figures)]


def heartbeat(detectors: DetectorSettings) -> Dict[str, Any]:
    """The settings the heartbeat's telemetry carries (status reads them): each detector's, or its default."""
    out: Dict[str, Any] = {}
    for spec in DETECTORS:
        settings = detectors.of(spec.key)
        for key in spec.heartbeat:
            out[key] = getattr(settings, key) if settings is not None else spec.key_of(key).default
    return out
