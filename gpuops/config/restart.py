"""The playbook's `restart:` section: how often, after what, with the compile guard or not."""

from __future__ import annotations

from gpuops.config import schema as s
from gpuops.config.model import Restart, Watch
from gpuops.config.yamlpos import Node, Scalar
from gpuops.errors import ConfigError

RESTART_KEYS = ("max", "on", "compile_guard", "delay", "warmup")
MAX_RESTARTS = 10


def known_names(watch: Watch) -> tuple[str, ...]:
    """What `restart.on` may name: the built-in rules, the playbook's rules, the detectors, stall, failed."""
    from gpuops.agent import detectors
    from gpuops.agent.protocol import RESTART_FAILED, RESTART_STALL
    from gpuops.agent.signatures.matcher import builtin_rules

    found = [r.name for r in builtin_rules()] + [r.name for r in watch.rules]
    found += [detectors.THROUGHPUT_DROP, detectors.MEMORY_SHIFT, detectors.MEMORY_VOLATILE, detectors.COMPILE_AFTER_WARMUP]
    return tuple(dict.fromkeys(found + [RESTART_STALL, RESTART_FAILED]))


def parse_restart(node: Node | None, watch: Watch) -> Restart | None:
    """None when the section is absent (no restarts)."""
    if node is None or s.is_null(node):
        return None
    sec = s.Section(node, "restart", RESTART_KEYS)
    fields: dict[str, object] = {}
    if (n := sec.get("max")) is not None:
        fields["max"] = s.integer(n, 0, MAX_RESTARTS, what="the number of restarts after the first attempt")
    if (n := sec.get("on")) is not None:
        fields["on"] = _names(n, watch)
    if (n := sec.get("compile_guard")) is not None:
        fields["compile_guard"] = s.boolean(n)
    if (n := sec.get("delay")) is not None:
        fields["delay"] = s.seconds(n, zero_ok=True)
    if (n := sec.get("warmup")) is not None:
        fields["warmup"] = s.boolean(n)
    return Restart(**fields)  # type: ignore[arg-type]


def _names(node: Node, watch: Watch) -> tuple[str, ...]:
    known = known_names(watch)
    out: dict[str, None] = {}
    for item in s.items(node, "rule names (a built-in rule, a playbook rule, a detector, stall or failed)"):
        name = item.text if isinstance(item, Scalar) and item.kind == "str" else None
        if name is None or name not in known:
            got = f"'{name}'" if name is not None else s.describe(item)
            raise ConfigError(item.mark, f"restart.on: {got} is no rule this playbook runs; expected one of "
                                         f"{', '.join(known)}{s.suggest(name or '', known)}")
        if name in out:
            raise ConfigError(item.mark, f"restart.on lists '{name}' twice")
        out[name] = None
    return tuple(out)
