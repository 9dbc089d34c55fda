"""The fatal-signature library and its matcher: standard library only, pure (bytes in, hits out)."""

from .matcher import ABORT, WARN, Hit, Matcher, Rule, builtin_rules, regex_rule

__all__ = ["ABORT", "WARN", "Hit", "Matcher", "Rule", "builtin_rules", "regex_rule"]
