"""watch.json, the rules a run was launched with, turned into a matcher and a stall clock's settings.

The client composes watch.json from the playbook at launch (gpuops.client.runspec); the watchdog,
and a client that takes over watching, build their matcher from it here, so both apply the
same rules in the same order.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ..detect.detectors import load
from ..signatures import Matcher, Rule, builtin_rules, metric_rule, regex_rule
from ..signatures.budget import Guard
from ..wire.watchfile import WatchConfig


def rules(cfg: WatchConfig) -> List[Rule]:
    """Built-in rules (actions overridden or turned off as the playbook says), then the playbook's
    own rules in order, then the metric rules the detectors read their figures with."""
    import dataclasses

    out: List[Rule] = []
    if cfg.builtin:
        overrides = dict(cfg.builtin_rules)
        for rule in builtin_rules():
            action = overrides.get(rule.name, rule.action)
            if action == "off":
                continue
            out.append(rule if action == rule.action else dataclasses.replace(rule, action=action))
    for spec in cfg.rules:
        out.append(regex_rule(spec.name, spec.pattern, spec.action))
    for detector, settings in cfg.detectors.on():
        out += [metric_rule(name, pattern) for name, pattern in load(detector).metrics(settings)]
    return out


def build_matcher(cfg: WatchConfig, offset: int = 0, line: int = 1, mask: Optional[Callable[[str], str]] = None,
                  prefilter: Any = None) -> Matcher:
    return Matcher(rules(cfg), start_offset=offset, start_line=line, mask=mask, guard=Guard(), prefilter=prefilter)


def stall_config(cfg: WatchConfig) -> Tuple[float, Optional[Dict[str, float]]]:
    """(timeout, auto settings or None) for StallClock; timeout 0 is off."""
    return cfg.stall.timeout, cfg.stall.auto
