"""watch.json, the rules a run was launched with, turned into a matcher and a stall clock's settings.

The client writes watch.json from the playbook at launch (gpuops.client.runspec); the watchdog,
and a client that stands in for a gone watchdog, build their matcher from it here, so both apply the
same rules in the same order.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from . import watchfile
from .signatures import Matcher, Rule, builtin_rules, metric_rule, regex_rule
from .signatures.budget import Guard

THROUGHPUT = watchfile.METRIC_THROUGHPUT
RECOMPILES = watchfile.METRIC_RECOMPILES
#: torch's TORCH_LOGS=recompiles line (REFERENCE.md): "[__recompiles] Recompiling function NAME in FILE"
RECOMPILE_PATTERN = r"Recompiling function (\S+)"


def rules(cfg: Dict[str, Any]) -> List[Rule]:
    """Built-in rules (actions overridden or turned off as the playbook says), then the playbook's
    own rules in order, then the metric rules the detectors read figures with."""
    import dataclasses

    out: List[Rule] = []
    if cfg.get("builtin", True):
        overrides = dict(cfg.get("builtin_rules") or {})
        for rule in builtin_rules():
            action = overrides.get(rule.name, rule.action)
            if action == "off":
                continue
            out.append(rule if action == rule.action else dataclasses.replace(rule, action=action))
    for spec in cfg.get("rules") or []:
        out.append(regex_rule(spec["name"], spec["pattern"], spec.get("action", "abort")))
    throughput = cfg.get("throughput")
    if throughput and throughput.get("pattern"):
        out.append(metric_rule(THROUGHPUT, throughput["pattern"]))
    if cfg.get("compile_after_warmup"):
        out.append(metric_rule(RECOMPILES, RECOMPILE_PATTERN))
    return out


def build_matcher(cfg: Dict[str, Any], offset: int = 0, line: int = 1, mask: Optional[Callable[[str], str]] = None,
                  prefilter: Any = None) -> Matcher:
    return Matcher(rules(cfg), start_offset=offset, start_line=line, mask=mask, guard=Guard(), prefilter=prefilter)


def stall_config(cfg: Dict[str, Any]) -> Tuple[float, Optional[Dict[str, float]]]:
    """(timeout, auto settings or None) for StallClock; timeout 0 is off."""
    return watchfile.stall_settings(cfg)
