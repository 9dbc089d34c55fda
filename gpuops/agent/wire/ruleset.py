"""watch.json, the rules a run was launched with, turned into a matcher and a stall clock's settings.

The client composes watch.json from the playbook at launch (gpuops.client.runspec); the watchdog,
and a client that stands in for a gone watchdog, build their matcher from it here, so both apply the
same rules in the same order. The quiet-failure detectors' figures (metric rules, which never match) are
the watchdog's own: it passes them in (agent/detect/detectors.figure_rules); a client judges no detector.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .signatures import Matcher, Rule, builtin_rules, metric_rule, regex_rule
from .signatures.budget import Guard
from .watchfile import WatchConfig


def rules(cfg: WatchConfig, figure_rules: Sequence[Tuple[str, str]] = ()) -> List[Rule]:
    """Built-in rules (actions overridden or turned off as the playbook says), then the playbook's
    own rules in order, then the metric rules the detectors read their figures with (`figure_rules`:
    (name, Python regex) pairs)."""
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
    out += [metric_rule(name, pattern) for name, pattern in figure_rules]
    return out


def build_matcher(cfg: WatchConfig, offset: int = 0, line: int = 1, mask: Optional[Callable[[str], str]] = None,
                  prefilter: Any = None, figure_rules: Sequence[Tuple[str, str]] = ()) -> Matcher:
    return Matcher(rules(cfg, figure_rules), start_offset=offset, start_line=line, mask=mask, guard=Guard(),
                   prefilter=prefilter)


def stall_config(cfg: WatchConfig) -> Tuple[float, Optional[Dict[str, float]]]:
    """(timeout, auto settings or None) for StallClock; timeout 0 is off."""
    return cfg.stall.timeout, cfg.stall.auto
