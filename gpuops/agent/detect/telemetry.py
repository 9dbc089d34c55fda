"""The sample store: a run's GPU and throughput samples kept in its run directory, bounded for
week-long runs (the figures themselves: throughput.py; the inductor cache: cachewatch.py; the line
format, which `gpuops status` reads too: wire/samples.py).

``samples.jsonl`` holds the recent raw samples, one compact JSON object a line. Once the raw file
spans ``raw_keep`` seconds plus a quarter, the samples older than ``raw_keep`` (cut on a bucket
boundary) are folded into ``samples-coarse.jsonl``, one line per ``bucket`` seconds, and the raw file
is rewritten with the rest (temporary file and rename). At a 2 s interval, 8 GPUs and six-digit MiB
figures that is ~0.5 MB of coarse lines a day plus at most ~0.4 MB raw: under 1 MB after a day, under
4 MB after a week. Coarse lines are appended before the raw file is replaced, and readers drop raw
samples older than the last bucket's end, so a crash between the two steps duplicates nothing.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence

from ..wire.records import SAMPLES, SAMPLES_COARSE
from ..wire.samples import Sample, compact, encode, line_time, parse_line, parse_lines, stamp
from ..wire.smi import GpuSample
from .throughput import median

__all__ = ["Sample", "TelemetryLog", "encode", "parse_lines", "read_samples"]  # the line format: wire/samples.py

_TAIL = 8192  # bytes read from the end of the coarse file to learn where it ends


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
    obj: Dict[str, Any] = {"t": json.loads(stamp(start)), "d": compact(span), "n": len(group), "g": rows}
    procs = [s.procs for s in group if s.procs is not None]
    if procs:
        obj["p"] = {str(g): max(p.get(g, 0) for p in procs) for g in sorted({g for p in procs for g in p})}
    tps = [s.throughput for s in group if s.throughput is not None]
    if tps:
        obj["tp"] = compact(median(tps))
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
                    t = line_time(line)
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
            t = line_time(line)
            if t is None or t < self._coarse_end:
                continue
            sample = parse_line(line) if t < cut else None
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
        self._first = line_time(kept[0]) if kept else None
