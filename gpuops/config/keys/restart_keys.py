"""The playbook's `restart:` section: how often, after what, with the compile guard or not."""

from __future__ import annotations

from gpuops.agent.wire import builtin_rules as builtin
from gpuops.agent.wire.detector_list import restartable
from gpuops.agent.wire.protocol import RESTART_FAILED, RESTART_STALL
from gpuops.config import schema as s
from gpuops.config.playbook_model import Restart, Watch
from gpuops.config.yamlpos import Node, Scalar
from gpuops.errors import ConfigError

RESTART_KEYS = ("max", "on", "compile_guard", "delay", "warmup", "command")
MAX_RESTARTS = 10
MAX_DELAY = 3600  # seconds between attempts at most: the run holds its GPUs (and its lock on them) while it waits


def known_names(watch: Watch) -> tuple[str, ...]:
    """What `restart.on` may name: the built-in rules, the playbook's rules, the detectors, stall, failed."""
    found = list(builtin.names()) + [r.name for r in watch.rules] + list(restartable())
    return tuple(dict.fromkeys(found + [RESTART_STALL, RESTART_FAILED]))


def parse_restart(node: Node | None, watch: Watch, warnings: list[str] | None = None) -> Restart | None:
    """None when the section is absent (no restarts); a name in `on` that can never end an attempt, and a section
    that can restart nothing (no `on`, or no `max`), are validate warnings: the run itself is as the file says."""
    if node is None or s.is_null(node):
        return None
    sec = s.Section(node, "restart", RESTART_KEYS)
    fields: dict[str, object] = {}
    if (n := sec.get("max")) is not None:
        fields["max"] = s.integer(n, 0, MAX_RESTARTS, what="the number of restarts after the first attempt")
    if (n := sec.get("on")) is not None:
        fields["on"] = _names(n, watch)
        for item in s.items(n, "rule names"):
            name = item.text if isinstance(item, Scalar) else ""  # _names said any other
            why = _never_ends(name, watch)
            if why and warnings is not None:
                warnings.append(f"{item.mark}: restart.on names '{name}', which {why}: it never ends an "
                                "attempt, so it never restarts one")
    if (n := sec.get("compile_guard")) is not None:
        fields["compile_guard"] = s.boolean(n)
    if (n := sec.get("delay")) is not None:
        fields["delay"] = s.seconds(n, zero_ok=True)
        if fields["delay"] > MAX_DELAY:  # type: ignore[operator]
            raise ConfigError(n.mark, f"expected a number of seconds 0..{MAX_DELAY} (the run keeps its GPUs while it "
                              f"waits to restart), got {s.describe(n)}")
    if (n := sec.get("warmup")) is not None:
        fields["warmup"] = s.boolean(n)
    if (n := sec.get("command")) is not None:
        fields["command"] = s.nonempty(n, "a command (what restarted attempts run, e.g. with --resume)")
    if warnings is not None and fields.get("max") != 0:  # `max: 0` turns restarts off on purpose
        if not fields.get("on"):
            warnings.append(f"{node.mark}: restart has no `on` (the rules whose end restarts an attempt, e.g. [stall, "
                            "failed]): no attempt is ever restarted")
        elif "max" not in fields:
            warnings.append(f"{node.mark}: restart has no `max` (0 by default): no attempt is ever restarted; set "
                            f"the number of restarts after the first attempt (1..{MAX_RESTARTS})")
    return Restart(**fields)  # type: ignore[arg-type]


def _never_ends(name: str, watch: Watch) -> str | None:
    """Why this rule cannot end an attempt (it only warns, or it is off), or None."""
    if name == RESTART_STALL:
        return "is off (watch.stall_timeout: 0)" if watch.stall_timeout == 0 and watch.stall_auto is None else None
    if name == RESTART_FAILED:
        return None
    own = {r.name: r.action for r in watch.rules}
    if name in own:
        return "only warns (its action)" if own[name] != "abort" else None
    detector = restartable().get(name)
    if detector is not None:
        settings = watch.detectors.of(detector.key)
        action = getattr(settings, "action", "off") if settings else "off"
        return None if action == "abort" else ("is off" if action == "off" else "only warns (action: warn)")
    if not watch.builtin:
        return "is a built-in rule, and watch.builtin is false"
    action = dict(watch.builtin_rules).get(name) or builtin.default_actions().get(name, "abort")
    return None if action == "abort" else ("is off" if action == "off" else "only warns")


def _names(node: Node, watch: Watch) -> tuple[str, ...]:
    return s.distinct_names(node, "rule names (a built-in rule, a playbook rule, a detector, stall or failed)",
                            known_names(watch), "restart.on", "is no rule this playbook runs")
