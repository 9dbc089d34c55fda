"""What every detector is: the class each detector module's `Detector` extends, the run it judges (Run),
the baseline it judges against, and what it returns (Finding).

A detector module (gpuops/agent/detect/<module>.py, named by its entry in wire/detector_list.py) defines
`class Detector(judge.Detector)`. The watchdog feeds every detector what it measured: the figures its
own metric rules read off the log (`metrics`, `measure`), nvidia-smi samples (`sample`), the GPUs' health
fields of the same samples (`health`), the Xids the host's kernel log showed on the run's GPUs (`xid`) and
the inductor cache's new files (`cache_dir`, `cache_files`, `cache_shared`); then asks `judge(t)` for the
findings that begin at t. Each input is optional: the base class ignores what a detector does not override.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..wire.builtin_rules import GUARD_HOWTO
from ..wire.detector_list import DetectorSpec
from ..wire.smi import GpuSample

__all__ = ["ABORT", "EAGER_ADVICE", "MIN_FIGURES", "NOTE", "WARN", "Baseline", "Detector", "Finding", "Run", "base_figures", "n"]

ABORT, WARN, NOTE = "abort", "warn", "note"
MIN_FIGURES = 3  # a median of fewer figures is noise
#: What a slower run, or memory at another level, likely is (the advice of more than one detector).
EAGER_ADVICE = (
    "likely the eager fallback, the FX thread-safety race's slow path (a thread fell back to eager mode, "
    "the process runs on): " + GUARD_HOWTO + "; or compile each device's function under one lock before the "
    "threads start and warm every shape")


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


@dataclass(frozen=True)
class Run:
    """What every detector of a run shares: when training started, the baseline, how many seconds of samples
    to keep (twice the longest span any of them looks back over, and 10 s), and on a node of a torchrun job
    its peers (watch/joblink.Peers: `node`, `share(t, figure)`, `figures()`; None elsewhere)."""

    started: float
    baseline: Optional[Baseline]
    horizon: float
    peers: Any = None


def base_figures(baseline: Optional[Baseline]) -> Dict[str, Any]:
    """The baseline's run and source, as every finding judged against it carries them."""
    return {"baseline_run": baseline.run if baseline else None, "baseline_source": baseline.source if baseline else None}


def n(value: float) -> str:
    """A figure for a message: thousands separated, no decimals."""
    return "{:,.0f}".format(value)


class Detector:
    """One detector of one run (its spec and settings, from watch.json). Override what it uses."""

    spec: DetectorSpec  # set by the loader (detect/detectors.py)

    def __init__(self, settings: Any, run: Run) -> None:
        self.settings, self.run = settings, run
        self.notes: List[Finding] = []  # said at the next judge(), before any detector's findings

    # -- what it asks of the watchdog (class methods: the matcher is built before any detector) ------------
    @classmethod
    def metrics(cls, settings: Any) -> Sequence[Tuple[str, str]]:
        """The figures it reads off the log: (name, Python regex) pairs, the figure the first group (or the match)."""
        return ()

    @classmethod
    def span(cls, settings: Any, baseline: Optional[Baseline]) -> float:
        """The seconds of past samples and figures it looks back over."""
        return 0.0

    def cache_dir(self, env: Mapping[str, str]) -> Optional[str]:
        """A folder whose new files it counts (the watchdog walks it), or None."""
        return None

    # -- what the watchdog measured --------------------------------------------------------------------------
    def measure(self, t: float, name: str, value: str) -> None:
        """A figure one of its metric rules read off the log at t."""

    def sample(self, t: float, gpus: GpuSample) -> None:
        """One nvidia-smi sample of the run's GPUs."""

    def health(self, t: float, sample: Any) -> None:
        """The health fields of the same sample (detect/sampler.HealthSample: each GPU's row, the GPUs nvidia-smi
        could not open, those it left out)."""

    def xid(self, t: float, record: Dict[str, Any]) -> None:
        """An Xid the host's kernel log showed on a GPU of the run (a host-xids.jsonl `xid` record: the line's
        facts, the catalog's words, the GPU's index, bus id and UUID)."""

    def cache_files(self, t: float, new: int, examples: List[str]) -> None:
        """New files in its cache folder since the snapshot at training start."""

    def unaccounted(self, new: int) -> bool:
        """Whether a walk's count of new files holds files it has not accounted for."""
        return False

    def cache_shared(self, t: float, runs: List[str], cache_dir: str) -> None:
        """Other runs may write to its cache folder: the snapshot took their files in, counting starts over."""

    # -- verdicts ----------------------------------------------------------------------------------------------
    def judge(self, t: float) -> List[Finding]:
        """The findings that begin at t."""
        return []

    def missing(self, gpus: Sequence[int]) -> List[str]:
        """What it has no baseline for (its spec has `baseline`): said in the one no-baseline note. `gpus`:
        the GPUs sampled that have no memory level in the baseline."""
        return []

    def profile(self) -> Dict[str, Any]:
        """What it adds to the run's profile (profile.keep_profile's keywords)."""
        return {}
