"""The watchdog's eyes for quiet failures: GPU samples, throughput figures, the inductor cache, verdicts.

One nvidia-smi process samples every GPU of the run in a loop (`-lms`: the driver is opened once,
not every sample); the throughput figures come from the log through the matcher's metric rule;
the inductor cache is walked every CACHE_EVERY sample intervals. All of it goes to the telemetry files
and to the detectors (detectors.py), judged against the baseline: the last good run of the same
playbook on this target, or the playbook's numbers. When the run ends its profile is kept.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

from ..system.procs import die_with_parent
from ..wire import protocol as p
from ..wire.health import SLOWDOWN
from ..wire.hostwire import HOST_LOG, HostLog, read_host_log
from ..wire.records import read_json
from ..wire.watchfile import WatchConfig
from .cacheshare import CacheSharing
from .cachewatch import CacheWatcher
from .detectors import Detectors, Finding, heartbeat
from .gpu_apps import ProcessLoop
from .profile import baseline_from_config, keep_profile, pick_baseline, run_digest
from .sampler import REFUSED, HealthSample, Sampler
from .telemetry import TelemetryLog
from .throughput import FIGURE, Figures, parse_figure

#: Sample intervals between walks of the inductor cache (a walk of 20,000 entries takes tens of ms):
#: every 10 s at the default 2 s interval.
CACHE_EVERY = 5


class HostFeed:
    """The run's host-xids.jsonl (what the host's kernel-log follower handed over), read from where it was left."""

    def __init__(self, d: str) -> None:
        self.d = d
        self.log = HostLog()

    def grew(self) -> bool:
        try:
            return os.path.getsize(os.path.join(self.d, HOST_LOG)) > self.log.size
        except OSError:
            return False

    def take(self) -> List[Dict[str, Any]]:
        """The Xid records that came since the last take."""
        before = len(self.log.xids)
        read_host_log(self.d, self.log.size, self.log)
        return self.log.xids[before:]


class Quiet:
    """Telemetry and the quiet-failure detectors of one run (inside the watchdog; wall-clock times)."""

    def __init__(self, d: str, cfg: WatchConfig, started: float, peers: Any = None) -> None:
        self.d, self.cfg, self.started = d, cfg, started
        self.gpus = list(cfg.gpus)
        self.interval = cfg.sample_interval
        self.telemetry = TelemetryLog(d)
        self.figures = Figures()
        meta = read_json(os.path.join(d, p.META)) or {}
        last, why = pick_baseline(os.path.dirname(d), str(cfg.playbook), exclude=os.path.basename(d),
                                  digest=run_digest(meta), target=meta.get("target"))
        self.baseline = baseline_from_config(cfg.detectors, last, self.gpus)
        self.detectors = Detectors(cfg.detectors, self.baseline, started, no_baseline=why, peers=peers)
        self.sampler = Sampler(self.gpus, self.interval) if self.gpus else None
        self.processes = ProcessLoop(self.gpus, CACHE_EVERY * self.interval, die_with_parent) if self.gpus else None
        self.samples = 0
        self.said_problem: Optional[str] = None
        self.cache = self._cache_watcher()
        self.cache_every = CACHE_EVERY * self.interval
        self.next_cache = time.time() + self.cache_every
        self.last_walk = started
        self.sharing = None if self.cache is None else CacheSharing(
            os.path.dirname(d), os.path.basename(d), self.cache.path, os.environ)
        self.fired: List[str] = []
        self.last: Dict[str, Any] = {}  # the newest figures, for the heartbeat
        self.health: Optional[HealthSample] = None  # the newest health sample (the restart gate reads it)
        self.host = HostFeed(d)

    def _cache_watcher(self) -> Optional[CacheWatcher]:
        folder = self.detectors.cache_dir({**os.environ, **self.cfg.env})
        if folder is None:
            return None
        watcher = CacheWatcher(folder)
        path = os.path.join(self.d, p.CACHE_SNAPSHOT)  # a restarted watchdog keeps the snapshot
        try:
            with open(path, encoding="utf-8") as fh:
                watcher.restore(fh.read().splitlines())  # the snapshot a restarted watchdog resumes
        except OSError:
            watcher.snapshot()
            self._keep_snapshot(watcher)
        return watcher

    def _keep_snapshot(self, watcher: Optional[CacheWatcher] = None) -> None:
        """The cache snapshot to the run directory (atomically), so a restarted watchdog judges against it."""
        watcher = watcher or self.cache
        if watcher is None:
            return
        path = os.path.join(self.d, p.CACHE_SNAPSHOT)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write("\n".join(watcher.seen()))
        os.replace(path + ".tmp", path)

    def measure(self, rule: str, value: str, now: float) -> None:
        """A figure the matcher read off the log: the run's throughput is telemetry too."""
        if rule == FIGURE:
            figure = parse_figure(value)
            if figure is not None:
                self.figures.add(figure)
                self.last["throughput"] = figure
        self.detectors.measure(now, rule, value)

    def tick(self, now: float) -> List[Finding]:
        """Read what arrived, judge; the findings that begin now."""
        if self.sampler is not None and self.processes is not None:  # (both, where the run has GPUs)
            self.processes.poll(now)
            if self.processes.uuids and "uuids" not in self.last:  # each GPU's UUID (the metrics' uuid label)
                self.last["uuids"] = {str(i): u for u, i in self.processes.uuids.items()}
            for sample, health in self.sampler.poll(now):
                self.samples += 1
                procs = self.processes.take()
                self.telemetry.append(now, sample, procs=procs, throughput=self.figures.take())
                self.detectors.sample(now, sample)
                self.detectors.health(now, health)
                self.health = health
                self.last["health"] = self.counters(health)
                self.last["gpus"] = {str(g): list(v) for g, v in sample.items()}
                if procs is not None:
                    self.last["processes"] = {str(g): n for g, n in procs.items()}
        if self.cache is not None and now >= self.next_cache:
            self.next_cache = now + self.cache_every
            new, examples = self.cache.new_files()
            others = self.sharing.others(self.last_walk) if self.sharing and self.detectors.unaccounted(new) else []
            self.last_walk = now
            if others:
                self.cache.absorb()
                self._keep_snapshot()
                self.detectors.cache_shared(now, others, self.cache.path)
            else:
                self.detectors.cache_files(now, new, examples)
        for record in self.host.take():
            self.detectors.xid(now, record)
        findings = self.detectors.judge(now)
        self.fired += [f.rule for f in findings if f.action != "note"]
        return findings

    def counters(self, health: HealthSample) -> Dict[str, Dict[str, int]]:
        """Each GPU's health counters for the heartbeat (the metrics' gpuops_gpu_health_* families read them)."""
        xids: Dict[str, int] = {}
        for record in self.host.log.xids:
            xids[str(record.get("index"))] = xids.get(str(record.get("index")), 0) + 1
        out: Dict[str, Dict[str, int]] = {}
        for index, row in health.rows.items():
            found = {"xids": xids.get(str(index), 0), "field_errors": len(row.errors)}
            ecc = row.count("ecc.errors.uncorrected.volatile.total")
            flags = {"remap_pending": row.flag("remapped_rows.pending"), "remap_failure": row.flag("remapped_rows.failure")}
            mask, action = row.mask, row.recovery_action
            found.update({k: int(v) for k, v in flags.items() if v is not None})
            if ecc is not None:
                found["ecc_uncorrected_volatile"] = ecc
            if mask is not None:
                found["slowdown"] = int(bool(mask & SLOWDOWN))
            if action is not None:
                found["recovery_action"] = int(action != "None")
            out[str(index)] = found
        return out

    def host_grew(self) -> bool:
        """The host's kernel-log follower handed something over since the last tick."""
        return self.host.grew()

    def fds(self) -> List[int]:
        """The samplers' pipes: the watchdog's wait ends when a sample arrives."""
        if self.sampler is None or self.processes is None:
            return []
        return self.sampler.fds() + self.processes.fds()

    def problem(self) -> Optional[str]:
        """Why GPU samples are missing, once per new reason."""
        why = self.sampler.problem if self.sampler is not None else None
        if why and why != self.said_problem:
            self.said_problem = why
            return why if why.startswith(REFUSED) else "no GPU samples: " + why
        return None

    def heartbeat(self) -> Dict[str, Any]:
        b = self.baseline
        return {"telemetry": {**self.last, **heartbeat(self.cfg.detectors), "baseline": None if b is None else {
            "run": b.run, "throughput": b.throughput, "source": b.source,
            "gpu_memory": None if b.gpu_memory is None else {str(k): v for k, v in b.gpu_memory.items()}}}}

    def finish(self) -> Dict[str, Any]:
        """Stop sampling and keep the run's profile (what later runs are judged against)."""
        if self.sampler is not None and self.processes is not None:
            self.sampler.stop()
            self.processes.stop()
        settle = self.detectors.settle()  # the profile's steady part starts after it (its own default: none judged)
        return keep_profile(self.d, findings=self.fired, **({"settle": settle} if settle is not None else {}),
                            **self.detectors.profile())
