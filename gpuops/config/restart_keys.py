"""The playbook's `restart:` section: how often, after what, with the compile guard or not."""

from __future__ import annotations

from gpuops.agent.wire import builtin_rules as builtin
from gpuops.agent.wire.detector_list import restartable
from gpuops.agent.wire.protocol import RESTART_FAILED, RESTART_STALL
from gpuops.config import schema as s
from gpuops.config.playbook_model import Restart, Watch
from gpuops.config.yamlpos import Node

RESTART_KEYS = ("max", "on", "compile_guard", "delay", "warmup", "command")
MAX_RESTARTS = 10


def known_names(watch: Watch) -> tuple[str, ...]:
    """What `restart.on` may name: the built-in rules, the playbook's rules, the detectors, stall, failed."""
    found = list(builtin.names()) + [r.name for r in watch.rules] + list(restartable())
    return tuple(dict.fromkeys(found + [RESTART_STALL, RESTART_FAILED]))


def parse_restart(node: Node | None, watch: Watch, warnings: list[str] | None = None) -> Restart | None:
    """None when the section is absent (no restarts); a name in `on` that can never end an attempt is a
    validate warning."""
    if node is None or s.is_null(node):
        return None
    sec = s.Section(node, "restart", RESTART_KEYS)
    fields: dict[str, object] = {}
    if (n := sec.get("max")) is not None:
        fields["max"] = s.integer(n, 0, MAX_RESTARTS, what="the number of restarts after the first attempt")
    if (n := sec.get("on")) is not None:
        fields["on"] = _names(n, watch)
        for item in s.items(n, "rule names"):
            why = _never_ends(str(getattr(item, "text", "")), watch)
            if why and warnings is not None:
                warnings.append(f"{item.mark}: restart.on names '{item.text}', which {why}: it never ends an "
                                "attempt, so it never restarts one")
    if (n := sec.get("compile_guard")) is not None:
        fields["compile_guard"] = s.boolean(n)
    if (n := sec.get("delay")) is not None:
        fields["delay"] = s.seconds(n, zero_ok=True)
    if (n := sec.get("warmup")) is not None:
        fields["warmup"] = s.boolean(n)
    if (n := sec.get("command")) is not None:
        fields["command"] = s.nonempty(n, "a command (what restarted attempts run, e.g. with --resume)")
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
