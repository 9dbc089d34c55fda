"""A run's profile (its steady figures, kept when it ends) and the baseline the next run is judged by.

``profile.json`` in the run directory::

    {"run": "20261201-102500-3fa9c2", "playbook": "dflash-drafter", "target": "ct200",
     "started": "2026-12-01T10:25:00Z", "ended": "2026-12-01T11:25:00Z", "duration_s": 3600.0,
     "warmup_seconds": {"5": 8.4}, "outcome": "succeeded", "exit_code": 0, "command_exit_code": 0,
     "rule": null, "by": null, "settle": 60.0, "findings": [],
     "throughput": {"median": 505695.0, "n": 1770, "figures_per_s": 0.5},
     "gpus": {"5": {"median": 1443, "min": 1443, "max": 1443, "swing": 0, "util_median": 17}},
     "samples": 1800, "digest": "9f3c2a1b0d4e5f60",
     "attempts": 1}

Figures are over the samples from ``settle`` seconds after the start (start-up is not steady);
coarse buckets count for the samples they stand for. ``findings`` are the detector rules that
matched (events.jsonl's detector matches, so a restarted watchdog loses none); ``digest`` is
of the command and env as meta.json shows them (secret values masked).

The baseline of a run is the newest earlier run of the same playbook on the same target whose
profile says it succeeded with no findings (a slow run that only warned must not become the
measure of the next), with the same digest (a changed batch size is a new measure, not a
regression), and that measured something steady (a run too short to have steady figures cannot
be one); or numbers the playbook gives.

A run the watchdog restarted (playbook ``restart:``) has one profile, its last attempt's (outcome,
exit code, findings, steady figures from that attempt's start): it is a baseline only if that
attempt succeeded. Each earlier attempt's profile stays in ``attempts/<n>/profile.json``, which no
baseline search reads: an aborted attempt never is one.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..wire import protocol as p
from ..wire.detector_list import DetectorSettings
from ..wire.protocol import ATTEMPT, EVENTS
from ..wire.records import (
    ABORT,
    EXIT_CODE,
    META,
    PROFILE,
    command_exit_code,
    outcome,
    read_json,
    read_text,
    write_json_atomic,
)
from ..wire.verdict import record_view as hardware_summary
from .judge import Baseline
from .telemetry import Sample, read_samples

__all__ = ["baseline_from_config", "baseline_from_profile", "build_profile", "find_baseline", "keep_profile",
           "pick_baseline", "run_digest", "weighted_median"]

_ISO = "%Y-%m-%dT%H:%M:%SZ"


def _epoch(stamp: Any) -> float | None:
    import calendar  # here, not above: it (and strptime) would cost a watchdog 0.6 MiB from its start

    try:
        return float(calendar.timegm(time.strptime(str(stamp), _ISO)))
    except (TypeError, ValueError):
        return None


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime(_ISO, time.gmtime(t))


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def weighted_median(pairs: Iterable[Tuple[float, int]]) -> float | None:
    """The median of values each standing for `weight` samples (a coarse bucket stands for its n)."""
    ordered = sorted((v, w) for v, w in pairs if v is not None and w > 0)
    total = sum(w for _, w in ordered)
    seen = 0
    for value, weight in ordered:
        seen += weight
        if 2 * seen >= total:
            return value
    return None


def _gpu_figures(steady: Sequence[Sample]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for gpu in sorted({g for s in steady for g in s.gpus}):
        rows = [(s, s.gpus.get(gpu, (None, None))) for s in steady]
        lows = [(s.low or {}).get(gpu, m) for s, (m, _) in rows if m is not None]
        highs = [(s.high or {}).get(gpu, m) for s, (m, _) in rows if m is not None]
        median = weighted_median((m, s.n) for s, (m, _) in rows if m is not None)
        if median is None:
            continue
        lo = min(v for v in lows if v is not None)
        hi = max(v for v in highs if v is not None)
        out[str(gpu)] = {"median": median, "min": lo, "max": hi, "swing": hi - lo,
                         "util_median": weighted_median((u, s.n) for s, (_, u) in rows if u is not None)}
    return out


def run_digest(meta: Dict[str, Any]) -> str:
    """What makes two runs comparable: their command, env (secrets masked), workdir and GPUs, as meta.json
    shows them: a run on 1 GPU in another folder is no measure of a 4-GPU run."""
    gpus = sorted(g for g in meta.get("gpus") or [] if isinstance(g, int))
    text = json.dumps({"command": meta.get("command"), "env": meta.get("env") or {}, "workdir": meta.get("workdir") or "",
                       "gpus": gpus}, sort_keys=True)
    return _sha256(text.encode("utf-8", "replace"))[:16]


def _sha256(data: bytes) -> str:
    """SHA-256 in hex from the interpreter's own implementation: hashlib loads OpenSSL, 3.7 MiB of a
    watchdog's memory for the one digest it makes at its start. hashlib where there is none."""
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]  # Python >= 3.12
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef]  # Python <= 3.11
        except ImportError:
            from hashlib import sha256  # type: ignore[no-redef]
    return sha256(data).hexdigest()


def logged_findings(run_dir: str, limit: int = 1 << 24) -> List[str]:
    """The detector rules its watchdog reported as matches in the current attempt (events.jsonl; a detector's
    match carries figures)."""
    found: Set[str] = set()
    try:
        with open(os.path.join(run_dir, EVENTS), "rb") as fh:
            for raw in iter(lambda: fh.readline(1 << 20), b""):
                limit -= len(raw)
                if limit < 0:
                    break
                if b'"figures"' not in raw and b'"restart"' not in raw:
                    continue
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(ev, dict) and ev.get("event") == "restart":
                    found = set()  # what came before was an earlier attempt's (its profile has them)
                if isinstance(ev, dict) and ev.get("event") == "match" and isinstance(ev.get("figures"), dict):
                    found.add(str(ev.get("rule")))
    except OSError:
        pass
    return sorted(found)


def build_profile(run_dir: str, *, settle: float = 60.0, findings: Sequence[str] = (),
                  session_alive: bool = False, ended: float | None = None,
                  figure_rate: float | None = None) -> Dict[str, Any]:
    """The run's profile from its records (meta.json, exit_code, abort.json, samples); see the module docstring."""
    meta = read_json(os.path.join(run_dir, META)) or {}
    exit_text = read_text(os.path.join(run_dir, EXIT_CODE))
    abort = read_json(os.path.join(run_dir, ABORT))
    samples = read_samples(run_dir)
    started = _epoch(meta.get("started_at"))
    first = started if started is not None else (samples[0].t if samples else None)
    if ended is None:
        ends = [_mtime(os.path.join(run_dir, EXIT_CODE)), _mtime(os.path.join(run_dir, ABORT)),
                samples[-1].t + samples[-1].span if samples else None]
        ended = max((e for e in ends if e is not None), default=None)
    attempt = read_json(os.path.join(run_dir, ATTEMPT)) or {}
    # A restarted run's figures are its last attempt's (the earlier ones' samples moved to attempts/<n>/).
    since = attempt.get("started") if isinstance(attempt.get("started"), (int, float)) else first
    steady = [s for s in samples if since is None or s.t >= since + settle]
    tp = [(s.throughput, s.n) for s in steady if s.throughput is not None]
    hardware = read_json(os.path.join(run_dir, p.HARDWARE))
    name, code = outcome(exit_text, abort, session_alive, hardware)
    return {
        "run": meta.get("id") or os.path.basename(os.path.normpath(run_dir)),
        "playbook": meta.get("playbook"),
        "target": meta.get("target"),
        "started": meta.get("started_at") or _iso(first),
        "ended": _iso(ended),
        "duration_s": round(ended - first, 3) if ended is not None and first is not None else None,
        "warmup_seconds": meta.get("warmup_seconds"),
        "outcome": name,
        "exit_code": code,
        "command_exit_code": command_exit_code(exit_text),
        "rule": (hardware or {}).get("rule") or (abort or {}).get("rule"),
        **({"hardware": hardware_summary(hardware)} if hardware else {}),
        "by": (abort or {}).get("by"),
        "settle": settle,
        "findings": sorted(set(findings) | set(logged_findings(run_dir))),
        "throughput": {"median": weighted_median(tp), "n": sum(n for _, n in tp),
                       "figures_per_s": None if figure_rate is None else round(figure_rate, 6)} if tp else None,
        "gpus": _gpu_figures(steady),
        "samples": sum(s.n for s in samples),
        "digest": run_digest(meta),
        "attempts": attempt.get("attempt") if isinstance(attempt.get("attempt"), int) else 1,
    }


def keep_profile(run_dir: str, **kwargs: Any) -> Dict[str, Any]:
    """Build the profile and write it to the run directory (atomically); returns it."""
    profile = build_profile(run_dir, **kwargs)
    write_json_atomic(os.path.join(run_dir, PROFILE), profile)
    return profile


def baseline_from_profile(profile: Dict[str, Any]) -> Baseline:
    """A profile's steady figures as a Baseline."""
    tp = (profile.get("throughput") or {}).get("median")
    rate = (profile.get("throughput") or {}).get("figures_per_s")
    gpus = {int(k): float(v["median"]) for k, v in (profile.get("gpus") or {}).items()
            if isinstance(v, dict) and v.get("median") is not None}
    return Baseline(profile.get("run"), float(tp) if tp is not None else None, gpus or None, "last",
                    float(rate) if isinstance(rate, (int, float)) and rate > 0 else None)


def find_baseline(runs_dir: str, playbook: str, exclude: str | None = None, **kwargs: Any) -> Baseline | None:
    """The baseline (see the module docstring), or None."""
    return pick_baseline(runs_dir, playbook, exclude, **kwargs)[0]


def pick_baseline(runs_dir: str, playbook: str, exclude: str | None = None, *, digest: str | None = None,
                  target: str | None = None, limit: int = 1000) -> Tuple[Baseline | None, str | None]:
    """The newest comparable good run's figures (run ids sort by start time), or None and why there is
    none when an earlier good run exists but is not comparable. `digest`/`target`: this run's (None: any)."""
    try:
        names = sorted((n for n in os.listdir(runs_dir) if n != exclude and n < (exclude or "~")), reverse=True)
    except OSError:
        return None, None
    warned: str | None = None
    changed: str | None = None
    for name in names[:limit]:
        profile = read_json(os.path.join(runs_dir, name, PROFILE))
        if not profile or profile.get("playbook") != playbook or profile.get("outcome") != "succeeded":
            continue
        if target is not None and profile.get("target") not in (None, target):
            continue
        baseline = baseline_from_profile(profile)
        if baseline.throughput is None and not baseline.gpu_memory:
            continue
        if profile.get("findings"):
            warned = warned or "run %s succeeded but reported %s" % (name, ", ".join(profile["findings"]))
            continue
        theirs = profile.get("digest") or run_digest(read_json(os.path.join(runs_dir, name, META)) or {})
        if digest is not None and theirs != digest:
            changed = changed or ("run %s ran another command, env, workdir or GPUs (a changed batch size is a "
                                  "new measure, not a regression)" % name)
            continue
        return baseline, None
    return None, "; ".join(w for w in (changed, warned) if w) or None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _levels(value: Any, gpus: Sequence[int]) -> Optional[Dict[int, float]]:
    """A playbook's gpu_memory baseline: one MiB figure for every GPU, or {gpu: MiB}."""
    if isinstance(value, dict):
        levels = {int(k): float(v) for k, v in value.items() if _number(v) is not None}
        return levels or None
    number = _number(value)
    return {int(g): number for g in gpus} if number is not None and gpus else None


def baseline_from_config(detectors: DetectorSettings, last: Baseline | None, gpus: Sequence[int] = ()) -> Baseline | None:
    """The baseline a run is judged by: the playbook's numbers where it gives them (`baseline: 505695`), else `last`'s.
    Each detector with a baseline gives its level's (wire/detector_list: throughput, gpu_memory)."""
    given = {spec.baseline: settings.baseline for spec, settings in detectors.on() if spec.baseline}
    throughput = _number(given.get("throughput"))
    levels = _levels(given.get("gpu_memory"), gpus)
    used: List[str] = ["playbook"] if throughput is not None or levels is not None else []
    if last is not None and (throughput is None or levels is None):
        if (throughput is None and last.throughput is not None) or (levels is None and last.gpu_memory):
            used.append("last")
        throughput = throughput if throughput is not None else last.throughput
        levels = levels if levels is not None else last.gpu_memory
    if throughput is None and not levels:
        return None
    return Baseline(last.run if last is not None and "last" in used else None, throughput, levels, "+".join(used))
