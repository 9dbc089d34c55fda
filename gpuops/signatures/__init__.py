"""The signature library as the client imports it: the target's matcher (``gpuops.target.signatures``)
and the optional hyperscan accelerator (``accel``), which only ever runs here."""

from gpuops.target.signatures import matcher
from gpuops.target.signatures.matcher import ABORT, WARN, Hit, Matcher, Rule, builtin_rules, regex_rule

__all__ = ["ABORT", "WARN", "Hit", "Matcher", "Rule", "builtin_rules", "regex_rule", "matcher"]
