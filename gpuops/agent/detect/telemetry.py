"""The sample store: a run's GPU and throughput samples kept in its run directory, bounded for
week-long runs (the figures themselves: throughput.py; the inductor cache: cachewatch.py).

``samples.jsonl`` holds the recent raw samples, one compact JSON object a line::

    {"t":1796120709.83,"g":{"5":[1443,17]},"p":{"5":1},"tp":505695}

(t: epoch seconds; g: GPU -> [memory MiB, utilisation %], null where nvidia-smi said [N/A];
p: compute processes per GPU, when known; tp: the median throughput figure logged since the
previous sample, when the log gave one). Once the raw file spans ``raw_keep`` seconds plus a
quarter, the samples older than ``raw_keep`` (cut on a bucket boundary) are folded into
``samples-coarse.jsonl``, one line per ``bucket`` seconds::

    {"t":1796120700,"d":60,"n":30,"g":{"5":[1443,1443,1450,17]},"p":{"5":1},"tp":505695}

(g: GPU -> [min, median, max memory, median utilisation]; p: the most processes seen; tp: the
median of the samples' throughput), and the raw file is rewritten with the rest (temporary file
and rename). At a 2 s interval, 8 GPUs and six-digit MiB figures that is ~0.5 MB of coarse
lines a day plus at most ~0.4 MB raw: under 1 MB after a day, under 4 MB after a week.
Coarse lines are appended before the raw file is replaced, and readers drop raw samples older
than the last bucket's end, so a crash between the two steps duplicates nothing.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from ..wire.records import SAMPLES, SAMPLES_COARSE
from ..wire.smi import GpuSample
from .throughput import finite, median

__all__ = ["Sample", "TelemetryLog", "encode", "parse_lines", "read_samples"]

_TAIL = 8192  # bytes read from the end of the coarse file to learn where it ends


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


def _compact(value: float) -> Union[int, float]:
    """A figure as few JSON characters as it needs: 6 significant digits, no ".0"."""
    value = float("%.6g" % value)
    return int(value) if value.is_integer() and abs(value) < 1e15 else value


def _stamp(t: float) -> str:
    """Epoch seconds to the hundredth, without trailing zeros."""
    return ("%.2f" % t).rstrip("0").rstrip(".")


def _j(value: Optional[int]) -> str:
    return "null" if value is None else str(int(value))


def encode(t: float, gpus: GpuSample, procs: Optional[Dict[int, int]] = None, throughput: float | None = None) -> str:
    """One raw sample line (no newline); formatted by hand, it is written every 2 s for weeks."""
    parts = ['{"t":%s,"g":{' % _stamp(t),
             ",".join('"%d":[%s,%s]' % (i, _j(m), _j(u)) for i, (m, u) in sorted(gpus.items())), "}"]
    if procs is not None:
        parts.append(',"p":{%s}' % ",".join('"%d":%d' % (i, n) for i, n in sorted(procs.items())))
    tp = finite(throughput)
    if tp is not None:
        parts.append(',"tp":%s' % json.dumps(_compact(tp)))
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
    tp = finite(float(obj["tp"])) if obj.get("tp") is not None else None
    if "d" not in obj:
        gpus = {int(k): (_opt_int(v[0]), _opt_int(v[1])) for k, v in obj["g"].items()}
        return Sample(t, gpus, procs, tp)
    rows = {int(k): [_opt_int(x) for x in v] for k, v in obj["g"].items()}
    if any(len(r) != 4 for r in rows.values()):
        raise ValueError("coarse row")
    return Sample(t, {k: (r[1], r[3]) for k, r in rows.items()}, procs, tp, int(obj["n"]), float(obj["d"]),
                  {k: r[0] for k, r in rows.items()}, {k: r[2] for k, r in rows.items()})


def _time(line: str) -> float | None:
    """A line's time, cheaply: our lines start with {"t":<number>, (rotation reads 2,000 of them)."""
    if line.startswith('{"t":'):
        end = line.find(",", 5)
        try:
            return float(line[5:end])
        except ValueError:
            pass
    sample = _parse_line(line)
    return sample.t if sample is not None else None


def _parse_line(line: str) -> Sample | None:
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
    return [s for s in map(_parse_line, text.split("\n")) if s is not None]


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _end(samples: Sequence[Sample]) -> float:
    """Where the coarse record ends: raw samples before this are already folded in."""
    return samples[-1].t + samples[-1].span if samples else -math.inf


def read_samples(run_dir: str) -> List[Sample]:
    """A run's whole record, coarse buckets then raw samples, in time order."""
    coarse = parse_lines(_read(os.path.join(run_dir, SAMPLES_COARSE)))
    end = _end(coarse)
    return coarse + [s for s in parse_lines(_read(os.path.join(run_dir, SAMPLES))) if s.t >= end]


def _median_int(values: Sequence[int]) -> int | None:
    return int(round(median(values))) if values else None


def _bucket_line(start: float, span: float, group: Sequence[Sample]) -> str:
    """The coarse line for the raw samples of one bucket."""
    rows: Dict[str, List[Optional[int]]] = {}
    for gpu in sorted({g for s in group for g in s.gpus}):
        mems = [m for m in (s.gpus.get(gpu, (None, None))[0] for s in group) if m is not None]
        utils = [u for u in (s.gpus.get(gpu, (None, None))[1] for s in group) if u is not None]
        rows[str(gpu)] = [min(mems) if mems else None, _median_int(mems), max(mems) if mems else None, _median_int(utils)]
    obj: Dict[str, Any] = {"t": json.loads(_stamp(start)), "d": _compact(span), "n": len(group), "g": rows}
    procs = [s.procs for s in group if s.procs is not None]
    if procs:
        obj["p"] = {str(g): max(p.get(g, 0) for p in procs) for g in sorted({g for p in procs for g in p})}
    tps = [s.throughput for s in group if s.throughput is not None]
    if tps:
        obj["tp"] = _compact(median(tps))
    return json.dumps(obj, separators=(",", ":"))


class TelemetryLog:
    """Appends a run's samples to its directory and keeps the files bounded (see the module docstring)."""

    def __init__(self, run_dir: str, *, raw_keep: float = 3600.0, bucket: float = 60.0) -> None:
        self.raw_path = os.path.join(run_dir, SAMPLES)
        self.coarse_path = os.path.join(run_dir, SAMPLES_COARSE)
        self.raw_keep = raw_keep
        self.bucket = bucket
        self._slack = max(bucket, raw_keep / 4.0)  # rotate every quarter of raw_keep, not every sample
        self._coarse_end = self._read_coarse_end()
        self._first = self._read_first()  # a restarted watchdog carries on with the files it finds

    def _read_coarse_end(self) -> float:
        try:
            with open(self.coarse_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL))
                return _end(parse_lines(f.read()))
        except OSError:
            return -math.inf

    def _read_first(self) -> float | None:
        try:
            with open(self.raw_path, encoding="utf-8", errors="replace") as f:
                for line in iter(lambda: f.readline(1 << 16), ""):
                    t = _time(line)
                    if t is not None:
                        return t
        except OSError:
            pass
        return None

    def append(self, t: float, gpus: GpuSample, procs: Optional[Dict[int, int]] = None,
               throughput: float | None = None) -> None:
        """Record one sample; folds old samples into buckets when the raw file has grown long enough."""
        with open(self.raw_path, "a", encoding="utf-8") as f:
            f.write(encode(t, gpus, procs, throughput) + "\n")
        if self._first is None:
            self._first = t
        elif t - self._first > self.raw_keep + self._slack:
            self.rotate(t)

    def rotate(self, now: float) -> None:
        """Fold raw samples older than raw_keep (whole buckets) into the coarse file; keep the rest raw."""
        cut = math.floor((now - self.raw_keep) / self.bucket) * self.bucket
        kept: List[str] = []
        groups: Dict[float, List[Sample]] = {}
        for line in _read(self.raw_path).split("\n"):
            t = _time(line)
            if t is None or t < self._coarse_end:
                continue
            sample = _parse_line(line) if t < cut else None
            if sample is not None:
                groups.setdefault(math.floor(sample.t / self.bucket) * self.bucket, []).append(sample)
            elif t >= cut:
                kept.append(line.strip())
        if groups:
            with open(self.coarse_path, "a", encoding="utf-8") as f:
                f.write("".join(_bucket_line(k, self.bucket, groups[k]) + "\n" for k in sorted(groups)))
                f.flush()
                os.fsync(f.fileno())
            self._coarse_end = max(groups) + self.bucket
        tmp = f"{self.raw_path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.raw_path)
        self._first = _time(kept[0]) if kept else None
