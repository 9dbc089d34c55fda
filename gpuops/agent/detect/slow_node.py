"""slow-node (watch.slow_node): on a node of a torchrun job, this node's throughput sits below the other nodes'.

Each node's watchdog reads its own throughput figure off its own log (watch.throughput.pattern's figure), keeps
the median over the window, and shares it with the other nodes through the job's store (the job link, signed:
watch/joblink.Peers); each node judges only itself against the median of the others' fresh figures, so the one
warning comes from the slow node and names it. A throttled or failing GPU makes its node's own work slower; in a
synchronous job every node then waits for it, so the figure to log is the node's own (its compute time, its
tokens a second before the collective), not the job's pace. Judges nothing on a run that is no node of a job, or
before a second node has a figure.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, List, Tuple

from . import judge
from .episodes import Episode, in_window, keep
from .judge import MIN_FIGURES, Finding, n
from .throughput import FIGURE, median, parse_figure

SLOW_NODE = "slow-node"
#: A node's figure counts as current for this many windows after it was shared.
FRESH_WINDOWS = 3.0


class Detector(judge.Detector):
    """This node's median figure over the window against the median of the other nodes' shared ones."""

    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self._figures: Deque[Tuple[float, float]] = deque(maxlen=100_000)
        self._episode = Episode(settings.window)
        self._shared_at = 0.0

    @classmethod
    def span(cls, settings: Any, baseline: Any) -> float:
        return settings.window

    def measure(self, t: float, name: str, value: str) -> None:
        figure = parse_figure(value) if name == FIGURE else None
        if figure is not None:
            self._figures.append((t, figure))
            keep(self._figures, t, self.run.horizon)

    def _mine(self, t: float) -> Any:
        values = in_window(self._figures, t - self.settings.window, t)
        return median(values) if len(values) >= MIN_FIGURES else None

    def judge(self, t: float) -> List[Finding]:
        peers, cfg = self.run.peers, self.settings
        if peers is None or t < self.run.started + cfg.settle:
            return []
        mine = self._mine(t)
        if mine is not None and t - self._shared_at >= max(1.0, cfg.window / 6):
            self._shared_at = t
            peers.share(t, mine)
        fresh = FRESH_WINDOWS * cfg.window
        others: Dict[str, float] = {node: fig for node, (fig, at) in peers.figures().items()
                                    if node != peers.node and abs(t - at) <= fresh and fig is not None}
        if mine is None or not others:
            self._episode.starts(t, None)
            return []
        typical = median(list(others.values()))
        bad = typical > 0 and mine < cfg.min_ratio * typical
        if not self._episode.starts(t, bad):
            return []
        ratio = mine / typical if typical else 0.0
        each = ", ".join("%s %s/s" % (node, n(fig)) for node, fig in sorted(others.items()))
        message = ("node %s's throughput %s/s over the last %g s is %.2fx the other nodes' median %s/s (%s)"
                   % (peers.node, n(mine), cfg.window, ratio, n(typical), each))
        advice = ("a throttled or failing GPU on %s slows the whole job (every node waits for it in each collective): "
                  "look at its GPUs (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,ECC there), then drain or replace the "
                  "node" % peers.node)
        figures = {"node": peers.node, "measured": mine, "others": others, "others_median": typical,
                   "ratio": round(ratio, 4), "min_ratio": cfg.min_ratio, "window": cfg.window, "gpu": None}
        return [Finding(SLOW_NODE, cfg.action, message, advice, figures)]
