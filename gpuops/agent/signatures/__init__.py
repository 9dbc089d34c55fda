"""The fatal-signature library and its matcher: standard library only, pure (bytes in, hits out)."""

from .matcher import Matcher
from .rules import ABORT, METRIC, WARN, Hit, Measure, Rule, builtin_rules, metric_rule, regex_rule

__all__ = ["ABORT", "METRIC", "WARN", "Hit", "Matcher", "Measure", "Rule", "builtin_rules", "metric_rule", "regex_rule"]
