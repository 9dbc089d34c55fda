"""What a hook or a notify command says, made safe to keep and show: control characters escaped."""

from __future__ import annotations

import re

#: C0 controls (but tab and newline), DEL and C1: a terminal acts on them (an OSC title, a screen clear).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def clean(text: str) -> str:
    """One line: every control character (newlines too) as \\xNN, never acted on by whatever shows it."""
    return _CONTROL_OR_LINE.sub(_escape, text)


def clean_lines(text: str) -> str:
    """Several lines (a command's output): tabs and newlines kept, every other control character as \\xNN."""
    return _CONTROL.sub(_escape, text)


def _escape(m: "re.Match[str]") -> str:
    c = ord(m.group(0))
    return "\\x%02x" % c if c < 0x100 else "\\u%04x" % c
