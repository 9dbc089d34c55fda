"""The Prometheus text format (version 0.0.4, the one node_exporter's textfile collector, the Pushgateway and
every Prometheus read), written by one function: `Exposition.render`. Standard library only.

What it guarantees whatever it is given: each family once, with its `# HELP` and `# TYPE` lines before its
samples; a label value escaped as the format says (backslash, double quote, newline) and never longer than
LABEL_MAX characters (a longer one is cut and given a digest of the whole, so two long names stay two);
text that is not UTF-8 replaced; a value that is no number left out; the same series given twice kept once.
Names (metric and label) are gpuops' own constants, checked when a family is declared (`Family`).
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

__all__ = ["CONTENT_TYPE", "LABEL_MAX", "Exposition", "Family", "SeriesKey", "escape_help", "escape_label",
           "label_value", "number", "series_key"]

#: What an exposition is served or pushed as.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: A label value's length at most, in characters: a longer one (a target name of 10,000 characters) is cut.
LABEL_MAX = 128
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
KINDS = ("gauge", "counter")

#: Label names checked once.
_NAMES_OK: Set[str] = set()


class Family:
    """One metric family: its name, type (gauge | counter) and help text, and the label names its series have
    beyond the run's own (e.g. `state`, `rule`); declared once, in wire/metric_table.py."""

    __slots__ = ("name", "kind", "help", "labels")

    def __init__(self, name: str, kind: str, help: str, labels: Sequence[str] = ()) -> None:  # noqa: A002
        if not _METRIC_NAME.match(name) or name.startswith("__"):
            raise ValueError("not a metric name: %r" % (name,))
        if kind not in KINDS:
            raise ValueError("not a metric type: %r" % (kind,))
        if (kind == "counter") != name.endswith("_total"):
            raise ValueError("a counter's name, and only a counter's, ends in _total: %r" % (name,))
        for label in labels:
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError("not a label name: %r" % (label,))
        self.name, self.kind, self.help, self.labels = name, kind, help, tuple(labels)

    def __repr__(self) -> str:
        return "Family(%r)" % self.name


def _text(value: object) -> str:
    """A string that encodes as UTF-8 (a lone surrogate, from undecodable bytes, becomes U+FFFD)."""
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "replace").decode("utf-8")


def label_value(value: object) -> str:
    """A label's value as it is exposed, before escaping: UTF-8, at most LABEL_MAX characters (a longer one keeps
    its start and ends with `~` and eight hex digits of its CRC-32, so two long names stay two)."""
    text = _text(value)
    if len(text) <= LABEL_MAX:
        return text
    return text[: LABEL_MAX - 9] + "~%08x" % (zlib.crc32(text.encode("utf-8")) & 0xFFFFFFFF)


def escape_label(value: str) -> str:
    """A label value inside its double quotes: backslash, double quote and line feed escaped (the format's
    three); every other character as it is."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """A help text on its `# HELP` line: backslash and line feed escaped."""
    return _text(text).replace("\\", "\\\\").replace("\n", "\\n")


def number(value: object) -> Optional[str]:
    """A sample's value as the format writes it (Go's ParseFloat reads it back); None for what is no number."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, float):
        return None
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


#: Label values as exposed and escaped, by the value given: a watchdog renders the same names every sample interval.
_SEEN: Dict[str, Tuple[str, str]] = {}
_SEEN_MAX = 4096


def _label(value: str) -> Tuple[str, str]:
    """(the value as exposed, escaped), remembered."""
    known = _SEEN.get(value)
    if known is None:
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        shown = label_value(value)
        known = _SEEN[value] = (shown, escape_label(shown))
    return known


#: A series' labels as exposed: (name, escaped value) pairs, those without a value left out.
SeriesKey = Tuple[Tuple[str, str], ...]


def series_key(labels: Mapping[str, object]) -> SeriesKey:
    """The labels checked (a name Prometheus accepts) and their values exposed and escaped, once."""
    key = tuple((name, _label(v if isinstance(v, str) else str(v))[1]) for name, v in labels.items()
                if v is not None and v != "")
    for name, _ in key:
        if name not in _NAMES_OK:
            if not _LABEL_NAME.match(name) or name.startswith("__"):
                raise ValueError("not a label name: %r" % (name,))
            _NAMES_OK.add(name)
    return key


class Exposition:
    """Samples gathered family by family (from any number of runs), rendered as one exposition."""

    def __init__(self) -> None:
        self._families: Dict[str, Family] = {}
        self._samples: Dict[str, Dict[SeriesKey, str]] = {}

    def add(self, family: Family, labels: Mapping[str, object], value: object) -> None:
        """One sample of `family`; a value that is no number (None) adds nothing; a series given again keeps its
        first value."""
        self.add_keyed(family, series_key(labels), value)

    def add_keyed(self, family: Family, key: "SeriesKey", value: object) -> None:
        """add() with the labels already made a series_key (several families of one series' labels: a GPU's)."""
        text = number(value)
        if text is None:
            return
        known = self._families.setdefault(family.name, family)
        if known is not family and (known.kind != family.kind or known.help != family.help):
            raise ValueError("two families named %s" % family.name)
        self._samples.setdefault(family.name, {}).setdefault(key, text)

    def __bool__(self) -> bool:
        return bool(self._samples)

    def render(self) -> str:
        """The text: every family's HELP and TYPE, then its samples; families and series in the order added."""
        out: List[str] = []
        for name, samples in self._samples.items():
            family = self._families[name]
            out.append("# HELP %s %s\n# TYPE %s %s\n" % (name, escape_help(family.help), name, family.kind))
            for key, value in samples.items():
                if key:
                    body = ",".join('%s="%s"' % kv for kv in key)
                    out.append("%s{%s} %s\n" % (name, body, value))
                else:
                    out.append("%s %s\n" % (name, value))
        return "".join(out)
