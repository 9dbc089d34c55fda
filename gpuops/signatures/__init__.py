"""The fatal-signature library and its matcher (see ``matcher``: stdlib only, pure)."""

from gpuops.signatures.matcher import ABORT, WARN, Hit, Matcher, Rule, builtin_rules, regex_rule

__all__ = ["ABORT", "WARN", "Hit", "Matcher", "Rule", "builtin_rules", "regex_rule"]
