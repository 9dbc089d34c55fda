"""The playbook's `launch.nodes` and `launch.torchrun`: one job over several targets, started by torchrun."""

from __future__ import annotations

from gpuops.config import schema as s
from gpuops.config.playbook_model import Torchrun
from gpuops.config.yamlpos import Node
from gpuops.errors import ConfigError
from gpuops.position import Mark

TORCHRUN_KEYS = ("nproc_per_node", "port", "collective_timeout", "async_error_handling", "flight_recorder")
MAX_NODES = 64


def parse_nodes(node: Node | None) -> tuple[tuple[str, ...], tuple[Mark, ...]]:
    """The node targets in rank order (the first is node 0) and where each is written; two at least."""
    if node is None or s.is_null(node):
        return (), ()
    names: list[str] = []
    marks: list[Mark] = []
    for item in s.items(node, "target names (the first is node 0)"):
        name = s.name(item, "a target name")
        if name in names:
            raise ConfigError(item.mark, f"target '{name}' is already node {names.index(name)}: each node is one target")
        names.append(name)
        marks.append(item.mark)
    if len(names) < 2:
        raise ConfigError(node.mark, "expected at least two targets in launch.nodes (one target needs no nodes: use "
                          "`target:` and run torchrun in launch.command yourself)")
    if len(names) > MAX_NODES:
        raise ConfigError(node.mark, f"expected at most {MAX_NODES} nodes, got {len(names)}")
    return tuple(names), tuple(marks)


def parse_torchrun(node: Node | None, nodes: tuple[str, ...], nodes_node: Node | None, launch_mark: Mark) -> Torchrun | None:
    """launch.torchrun's settings; required with launch.nodes and meaningless without."""
    if node is None or s.is_null(node):
        if nodes:
            raise ConfigError(nodes_node.mark if nodes_node is not None else launch_mark,
                              "launch.nodes needs launch.torchrun ({nproc_per_node: N, port: P}): the job is started "
                              "by torchrun on every node")
        return None
    if not nodes:
        raise ConfigError(node.mark, "launch.torchrun needs launch.nodes (the targets the job spans, node 0 first)")
    sec = s.Section(node, "launch.torchrun", TORCHRUN_KEYS)
    fields: dict[str, object] = {}
    if (n := sec.get("nproc_per_node")) is not None:
        fields["nproc_per_node"] = s.integer(n, 1, 1024, what="the number of worker processes per node")
    if (n := sec.get("port")) is not None:
        fields["port"] = s.integer(n, 1, 65535, what="the rendezvous port on node 0")
    if (n := sec.get("collective_timeout")) is not None:
        fields["collective_timeout"] = s.seconds(n, zero_ok=False)
    if (n := sec.get("async_error_handling")) is not None:
        fields["async_error_handling"] = s.boolean(n)
    if (n := sec.get("flight_recorder")) is not None:
        fields["flight_recorder"] = s.boolean(n)
    return Torchrun(**fields)  # type: ignore[arg-type]
