"""The fatal-signature library and its matcher: standard library only, pure (bytes in, hits out). In the wire
because both sides run it: the watchdog beside the run, and a client viewing it (its shadow matcher, the
playbook's rules checked at load, the hyperscan prefilter in client/accel.py).

The matcher (and its regex budget) is imported when first named: the client's config loading
reads only the rules' texts (through watchfile and detectors), and every gpuops command paid
~30 ms for a matcher it never ran (issue 21: status' cost).
"""

from typing import Any

from .rules import ABORT, METRIC, WARN, Hit, Measure, Rule, builtin_rules, metric_rule, regex_rule

__all__ = ["ABORT", "METRIC", "WARN", "Hit", "Matcher", "Measure", "Rule", "builtin_rules", "metric_rule", "regex_rule"]


def __getattr__(name: str) -> Any:
    """`Matcher` on first use (PEP 562)."""
    if name == "Matcher":
        from .matcher import Matcher

        return Matcher
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
