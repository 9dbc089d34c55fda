"""The playbook's watch section: rules, built-in rule actions, the stall clock and the quiet-failure detectors
(each detector's keys read as its entry in gpuops/agent/wire/detector_list.py declares them: detector_keys.py)."""

from __future__ import annotations

import os
from typing import Mapping as Env
from typing import Sequence as Seq

from gpuops.agent.wire import builtin_rules as builtin
from gpuops.agent.wire import watchfile as wf
from gpuops.agent.wire.detector_list import DETECTORS as DETECTOR_LIST
from gpuops.agent.wire.detector_list import DetectorSettings
from gpuops.config import schema as s
from gpuops.config.keys.detector_keys import compile_pattern, parse_detector
from gpuops.config.keys.metrics_keys import parse_metrics
from gpuops.config.playbook_model import HOST_LOG_MODES, EnvVar, RuleSpec, StallAuto, Watch
from gpuops.config.yamlpos import Node, Scalar
from gpuops.errors import ConfigError
from gpuops.position import Mark

WATCH_KEYS = ("builtin", "builtin_rules", "rules", "stall_timeout", "stall_auto", "sample_interval") + tuple(
    spec.key for spec in DETECTOR_LIST) + ("recompiles", "stacks", "metrics", "host_kernel_log")
RULE_KEYS = ("name", "pattern", "action")
STALL_AUTO_KEYS = ("floor", "factor", "settle", "initial")
# Detectors report as rules of these names; their actions are set under their own keys.
DETECTORS = {rule: "watch." + spec.key for spec in DETECTOR_LIST for rule in spec.rules}


def parse_watch(node: Node | None, env: Seq[EnvVar], warnings: list[str], environ: Env[str, str] = os.environ,
                need_env: bool = True) -> Watch:
    """The watch section as a Watch; findings that do not stop a run go to warnings (environ: where a
    from_env URL is read, as load_playbook says)."""
    given_env = {v.name: v.value for v in env if v.value}
    if node is None:
        return Watch(detectors=DetectorSettings(tuple((spec.key, spec.defaults(given_env) if spec.default_on else None)
                                            for spec in DETECTOR_LIST)))
    sec = s.Section(node, "watch", WATCH_KEYS)
    fields: dict[str, object] = {}
    if (n := sec.get("builtin")) is not None:
        fields["builtin"] = s.boolean(n)
    if (n := sec.get("builtin_rules")) is not None:
        if fields.get("builtin") is False:
            raise ConfigError(
                sec.key_mark("builtin_rules"),
                "watch.builtin_rules has no effect with watch.builtin: false (no built-in rule runs); "
                "remove one of them",
            )
        fields["builtin_rules"] = _builtin_rules(n)
    if (n := sec.get("rules")) is not None:
        fields["rules"] = _rules(n, warnings)
    fields["stall_timeout"], fields["stall_auto"] = _stall(sec)
    interval_node = sec.get("sample_interval")
    interval = s.seconds(interval_node, zero_ok=False, at_least=0.5) if interval_node else Watch.sample_interval
    fields["sample_interval"] = interval
    sampling = (interval, interval_node.mark if interval_node else None)
    fields["detectors"] = DetectorSettings(tuple((spec.key, parse_detector(spec, sec.get(spec.key), given_env, sampling, warnings))
                                       for spec in DETECTOR_LIST))
    if (n := sec.get("recompiles")) is not None:
        fields["recompiles"] = s.boolean(n)
    if (n := sec.get("stacks")) is not None:
        fields["stacks"] = s.choice(n, wf.STACKS_POLICIES, "when to record the training's stacks")
    if (n := sec.get("host_kernel_log")) is not None:
        fields["host_kernel_log"] = s.choice(n, HOST_LOG_MODES, "whether to follow the host's kernel log for Xids")
    if (n := sec.get("metrics")) is not None:
        fields["metrics"] = parse_metrics(n, environ, need_env)
    return Watch(**fields)  # type: ignore[arg-type]


def _builtin_rules(node: Node) -> tuple[tuple[str, str], ...]:
    names = builtin.names()
    actions: list[tuple[str, str]] = []
    for key, value in s.entries(node, "watch.builtin_rules"):
        name = key.text
        if name in DETECTORS:
            raise ConfigError(
                key.mark, f"'{name}' is a detector, not a built-in rule: set its action under {DETECTORS[name]}"
            )
        if name not in names:
            raise ConfigError(
                key.mark, f"unknown built-in rule '{name}' (built-in rules: {', '.join(names)}){s.suggest(name, names)}"
            )
        actions.append((name, s.choice(value, ("abort", "warn", "off"), f"an action for built-in rule '{name}'")))
    return tuple(actions)


def _rules(node: Node, warnings: list[str]) -> tuple[RuleSpec, ...]:
    rules: list[RuleSpec] = []
    seen: dict[str, Mark] = {}
    for index, item in enumerate(s.items(node, "rules (each with name, pattern, action)")):
        sec = s.Section(item, f"watch.rules[{index}]", RULE_KEYS)
        name_node = sec.require("name", "a rule name")
        name = s.name(name_node, "a rule name")
        if name in seen:
            first = seen[name]
            raise ConfigError(
                name_node.mark, f"duplicate rule name '{name}' (first at line {first.line}, column {first.column})"
            )
        seen[name] = name_node.mark
        pattern_node = sec.require("pattern", "a Python regular expression")
        pattern = s.text(pattern_node, "a Python regular expression")
        if not pattern:
            raise ConfigError(pattern_node.mark, f"rule '{name}' has an empty pattern, which would match every line")
        compile_pattern(pattern_node, pattern, f"pattern of rule '{name}'", warnings)
        action_node = sec.get("action")
        action = s.choice(action_node, ("abort", "warn"), "an action") if action_node else "abort"
        rules.append(RuleSpec(name=name, pattern=pattern, action=action))  # type: ignore[arg-type]
    return tuple(rules)


def _stall(sec: s.Section) -> tuple[float, StallAuto | None]:
    """stall_timeout: seconds (0 = off) or auto, tuned by stall_auto."""
    node, auto_node = sec.get("stall_timeout"), sec.get("stall_auto")
    if isinstance(node, Scalar) and node.kind == "str" and node.text == "auto":
        auto = _stall_auto(auto_node) if auto_node is not None else StallAuto()
        return auto.initial, auto
    if sec.given("stall_auto"):
        now = f"stall_timeout is {s.describe(node)}" if node is not None else "stall_timeout is not set"
        raise ConfigError(sec.key_mark("stall_auto"), f"watch.stall_auto applies only with stall_timeout: auto ({now})")
    if node is None:
        return Watch.stall_timeout, None
    try:
        return s.seconds(node, zero_ok=True), None
    except ConfigError:
        hint = s.suggest(node.text, ["auto"]) if isinstance(node, Scalar) and node.kind == "str" else ""
        raise ConfigError(
            node.mark,
            f"expected a number of seconds >= 0, got {s.describe(node)} (0 turns it off; auto learns it from the run)"
            f"{hint}",
        ) from None


def _stall_auto(node: Node) -> StallAuto:
    sec = s.Section(node, "watch.stall_auto", STALL_AUTO_KEYS)
    fields: dict[str, float] = {}
    for key in ("floor", "settle", "initial"):
        if (n := sec.get(key)) is not None:
            fields[key] = s.seconds(n, zero_ok=False)
    if (n := sec.get("factor")) is not None:
        fields["factor"] = s.number(n, "a factor", above=1)
    return StallAuto(**fields)
