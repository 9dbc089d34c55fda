"""The fatal-signature library and its matcher (``matcher``: stdlib only, pure; ``accel``: hyperscan, optional)."""

from gpuops.signatures.matcher import ABORT, WARN, Hit, Matcher, Rule, builtin_rules, regex_rule

__all__ = ["ABORT", "WARN", "Hit", "Matcher", "Rule", "builtin_rules", "regex_rule"]
