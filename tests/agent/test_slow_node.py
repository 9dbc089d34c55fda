"""slow-node (gpuops/agent/detect/slow_node.py) on an injected clock, its peers a stand-in for the job link: a node
whose median figure over the window sits below min_ratio x the other nodes' warns once, naming itself; it shares
its own figure; nothing is judged without another node's current figure, nor on a run that is no job's node."""

from __future__ import annotations

from typing import Any

from gpuops.agent.detect.detectors import load
from gpuops.agent.detect.judge import Run
from gpuops.agent.detect.throughput import FIGURE
from gpuops.agent.wire.detector_list import by_key

SPEC = by_key("slow_node")


class Peers:
    """What the job link gives the detector: this node's name, what it shared, the others' figures."""

    def __init__(self, node: str, others: dict[str, tuple[float, float]]) -> None:
        self.node, self.others, self.shared = node, others, []

    def share(self, t: float, figure: float) -> None:
        self.shared.append((t, figure))

    def figures(self) -> dict[str, tuple[float, float]]:
        return dict(self.others)


def detector(peers: Any) -> Any:
    return load(SPEC)(SPEC.settings(settle=10.0, window=20.0), Run(0.0, None, 100.0, peers))


def feed(d: Any, figure: float, start: float, end: float) -> list[Any]:
    found = []
    t = start
    while t <= end:
        d.measure(t, FIGURE, f"{figure:g}")
        found += d.judge(t)
        t += 1.0
    return found


def test_the_slow_node_warns_once_naming_itself_and_shares_its_figure() -> None:
    peers = Peers("ct201", {"ct200": (1000.0, 30.0), "ct202": (980.0, 30.0)})
    d = detector(peers)
    found = feed(d, 300.0, 0.0, 60.0)
    assert [f.rule for f in found] == ["slow-node"] and found[0].action == "warn"
    f = found[0]
    assert f.figures["node"] == "ct201" and f.figures["others"] == {"ct200": 1000.0, "ct202": 980.0}
    assert f.message == ("node ct201's throughput 300/s over the last 20 s is 0.30x the other nodes' median 990/s "
                         "(ct200 1,000/s, ct202 980/s)")
    assert peers.shared and all(fig == 300.0 for _, fig in peers.shared)


def test_a_node_as_fast_as_the_others_or_alone_or_no_jobs_node_is_not_warned_about() -> None:
    assert feed(detector(Peers("ct200", {"ct201": (1000.0, 30.0)})), 950.0, 0.0, 60.0) == []
    assert feed(detector(Peers("ct200", {})), 100.0, 0.0, 60.0) == []  # no other node's figure yet
    assert feed(detector(Peers("ct200", {"ct201": (1000.0, -500.0)})), 100.0, 0.0, 60.0) == []  # stale
    assert feed(detector(None), 100.0, 0.0, 60.0) == []
