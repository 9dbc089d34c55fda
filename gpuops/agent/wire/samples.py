"""A run's GPU and throughput samples as samples.jsonl and samples-coarse.jsonl hold them, one JSON object a
line: written by the watchdog's sample store (agent/detect/telemetry.py, which keeps the files bounded), read
back by it, by the run's profile, and by `gpuops status` from the probe's tail of them. Standard library only.

A raw line::

    {"t":1796120709.83,"g":{"5":[1443,17]},"p":{"5":1},"tp":505695}

(t: epoch seconds; g: GPU -> [memory MiB, utilisation %], null where nvidia-smi said [N/A]; p: compute
processes per GPU, when known; tp: the median throughput figure logged since the previous sample). A coarse
line stands for the raw samples of one bucket of `d` seconds::

    {"t":1796120700,"d":60,"n":30,"g":{"5":[1443,1443,1450,17]},"p":{"5":1},"tp":505695}

(g: GPU -> [min, median, max memory, median utilisation]; p: the most processes seen; tp: their median).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from .smi import GpuSample

__all__ = ["Sample", "compact", "encode", "line_time", "parse_line", "parse_lines", "stamp"]


def _finite(value: Optional[float]) -> Optional[float]:
    """The value, or None when it is missing, NaN or infinite (such a figure is never written)."""
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class Sample:
    """One raw sample, or one coarse bucket (span > 0) standing for n raw samples."""

    t: float
    gpus: GpuSample  # coarse: the bucket's median memory and utilisation
    procs: Optional[Dict[int, int]] = None
    throughput: Optional[float] = None
    n: int = 1
    span: float = 0.0
    low: Optional[Dict[int, Optional[int]]] = None  # coarse: min memory per GPU
    high: Optional[Dict[int, Optional[int]]] = None  # coarse: max memory per GPU

    @property
    def coarse(self) -> bool:
        return self.span > 0

    def memory(self, gpu: int) -> int | None:
        """This sample's memory on gpu (MiB), None when not measured."""
        return self.gpus.get(gpu, (None, None))[0]


def compact(value: float) -> Union[int, float]:
    """A figure as few JSON characters as it needs: 6 significant digits, no ".0"."""
    value = float("%.6g" % value)
    return int(value) if value.is_integer() and abs(value) < 1e15 else value


def stamp(t: float) -> str:
    """Epoch seconds to the hundredth, without trailing zeros."""
    return ("%.2f" % t).rstrip("0").rstrip(".")


def _j(value: Optional[int]) -> str:
    return "null" if value is None else str(int(value))


def encode(t: float, gpus: GpuSample, procs: Optional[Dict[int, int]] = None, throughput: float | None = None) -> str:
    """One raw sample line (no newline); formatted by hand, it is written every 2 s for weeks."""
    parts = ['{"t":%s,"g":{' % stamp(t),
             ",".join('"%d":[%s,%s]' % (i, _j(m), _j(u)) for i, (m, u) in sorted(gpus.items())), "}"]
    if procs is not None:
        parts.append(',"p":{%s}' % ",".join('"%d":%d' % (i, n) for i, n in sorted(procs.items())))
    tp = _finite(throughput)
    if tp is not None:
        parts.append(',"tp":%s' % json.dumps(compact(tp)))
    parts.append("}")
    return "".join(parts)


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is int:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(value)
    return int(value)


def _decode(obj: Any) -> Sample:
    """A parsed line as a Sample; KeyError/TypeError/ValueError when it is not one of ours."""
    t = float(obj["t"])
    procs = {int(k): int(v) for k, v in obj["p"].items()} if "p" in obj else None
    tp = _finite(float(obj["tp"])) if obj.get("tp") is not None else None
    if "d" not in obj:
        gpus = {int(k): (_opt_int(v[0]), _opt_int(v[1])) for k, v in obj["g"].items()}
        return Sample(t, gpus, procs, tp)
    rows = {int(k): [_opt_int(x) for x in v] for k, v in obj["g"].items()}
    if any(len(r) != 4 for r in rows.values()):
        raise ValueError("coarse row")
    return Sample(t, {k: (r[1], r[3]) for k, r in rows.items()}, procs, tp, int(obj["n"]), float(obj["d"]),
                  {k: r[0] for k, r in rows.items()}, {k: r[2] for k, r in rows.items()})


def line_time(line: str) -> float | None:
    """A line's time, cheaply: our lines start with {"t":<number>, (rotation reads 2,000 of them)."""
    if line.startswith('{"t":'):
        end = line.find(",", 5)
        try:
            return float(line[5:end])
        except ValueError:
            pass
    sample = parse_line(line)
    return sample.t if sample is not None else None


def parse_line(line: str) -> Sample | None:
    line = line.strip()
    if not line:
        return None
    try:
        return _decode(json.loads(line))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None


def parse_lines(text: Union[str, bytes]) -> List[Sample]:
    """Samples in file order; lines that do not parse (a torn head from `tail -c`, a half-written end) are skipped."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [s for s in map(parse_line, text.split("\n")) if s is not None]
