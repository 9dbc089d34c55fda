"""A run's snapshot for Prometheus, read off its records: the one reader that the watchdog's metrics duty and the
`metrics` tool share (agent/wire/metric_table.py renders what it returns).

What it reads: meta.json (target, playbook, session, phase), the heartbeat (watchdog.json, or the watchdog's own
record in memory: the state, attempt, stall timeout and telemetry: GPU samples, throughput, baseline, UUIDs),
attempt.json and attempts/<n>/ (restarts and the rules after which they came), abort.json (aborts by rule),
exit_code, the log's mtime (the stall clock: any byte, carriage returns too, moves it), and events.jsonl read
on from where it was left (reported matches, notification deliveries). A rule label is a rule of the run (its
playbook's, a built-in's, a detector's, or a stop's reason); anything else is `other`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Set, Tuple

from ..wire import builtin_rules, channel_list, detector_list
from ..wire import protocol as p
from ..wire.metric_table import GpuReading, RunSnapshot
from ..wire.records import command_exit_code, outcome, read_json, read_text
from ..wire.watchfile import WatchConfig

#: abort.json reasons that are no rule: the aborts counter names them as its rule.
STOP_REASONS = ("stall", "stop", "timeout", "interrupt", p.JOB_ABORT)
#: events.jsonl read at most this much per look (a watchdog's pass); the tool reads on to the end.
READ_EVERY = 1 << 22


def known_rules(cfg: WatchConfig) -> Set[str]:
    """Every rule name a label of this run may take: its playbook's, the built-ins, the detectors', stops."""
    return ({r.name for r in cfg.rules} | set(builtin_rules.names()) | set(detector_list.rules())
            | {p.RESTART_STALL, p.RESTART_FAILED} | set(STOP_REASONS))


def _dict(record: Dict[str, Any], key: str) -> Dict[str, Any]:
    """record[key] where it is a mapping, else {} (a record from an older or newer gpuops)."""
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def _mtime(path: str) -> Optional[float]:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class EventTally:
    """Reported matches and notification deliveries in events.jsonl, read on from the last look."""

    def __init__(self, path: str, rules: Set[str]) -> None:
        self.path, self.rules = path, rules
        self.offset, self.inode = 0, 0
        self.matches: Dict[Tuple[str, str], int] = {}
        self.notified: Dict[Tuple[str, str], list] = {}

    def read(self, limit: int = READ_EVERY) -> None:
        try:
            with open(self.path, "rb") as fh:
                inode = os.fstat(fh.fileno()).st_ino
                if inode != self.inode:  # a new file (the run directory made again): counted from its start
                    self.offset, self.inode, self.matches, self.notified = 0, inode, {}, {}
                fh.seek(self.offset)
                data = fh.read(limit)
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # whole lines only: a line being written is read at the next look
        self.offset += end
        for raw in data[:end].splitlines():
            if b'"match"' in raw or b'"notify_' in raw:
                self._one(raw)

    def _one(self, raw: bytes) -> None:
        try:
            ev = json.loads(raw)
        except ValueError:
            return
        if not isinstance(ev, dict):
            return
        kind = ev.get("event")
        if kind == "match":
            rule = str(ev.get("rule")) if ev.get("rule") in self.rules else "other"
            action = str(ev.get("action")) if ev.get("action") in ("abort", "warn") else "other"
            self.matches[(rule, action)] = self.matches.get((rule, action), 0) + 1
        elif kind in ("notify_sent", "notify_failed") and ev.get("channel") is not None:
            what = str(ev.get("what")) if ev.get("what") in p.NOTIFY_WHATS + (p.NOTIFY_TEST,) else "other"
            via = str(ev.get("via")) if ev.get("via") in channel_list.kinds() else "other"
            counts = self.notified.setdefault((what, via), [0, 0])
            counts[0 if kind == "notify_sent" else 1] += 1


class Reader:
    """One run's snapshots: `snapshot(now, beat, live)` each time the run is looked at."""

    def __init__(self, d: str, cfg: WatchConfig) -> None:
        self.d, self.cfg = d, cfg
        self.meta = read_json(os.path.join(d, p.META)) or {}
        self.rules = known_rules(cfg)
        self.events = EventTally(os.path.join(d, p.EVENTS), self.rules)

    def _rule(self, record: Dict[str, Any]) -> str:
        rule = record.get("rule") or record.get("reason")
        if record.get("reason") == p.JOB_ABORT:
            rule = record.get("rule") or record.get("first_reason") or p.JOB_ABORT
        return rule if rule in self.rules else "other"

    def counts(self, attempt: int) -> Tuple[Dict[str, int], Dict[str, int]]:
        """(aborts by rule, restarts by the rule they came after), over every attempt of the run."""
        aborts: Dict[str, int] = {}
        restarts: Dict[str, int] = {}
        for n in range(1, attempt):
            folder = p.attempt_dir(self.d, n)
            ended = read_json(os.path.join(folder, p.ATTEMPT))
            if ended is not None:
                rule = self._rule(ended)
                restarts[rule] = restarts.get(rule, 0) + 1
            stopped = read_json(os.path.join(folder, p.ABORT))
            if stopped is not None:
                rule = self._rule(stopped)
                aborts[rule] = aborts.get(rule, 0) + 1
        current = read_json(os.path.join(self.d, p.ABORT))
        if current is not None:
            rule = self._rule(current)
            aborts[rule] = aborts.get(rule, 0) + 1
        return aborts, restarts

    def state(self, beat: Dict[str, Any], live: bool) -> Tuple[str, Optional[int], Optional[float]]:
        """(state, gpuops' exit code once ended, when it ended)."""
        abort = read_json(os.path.join(self.d, p.ABORT))
        phase = self.meta.get("phase")
        if live:
            if phase in p.WARMING_PHASES and not beat:
                return p.RunState.WARMING.value, None, None
            attempt = read_json(os.path.join(self.d, p.ATTEMPT)) or {}
            if beat.get("state") == p.WATCHDOG_RESTARTING or attempt.get("state") in p.ATTEMPT_PENDING:
                return p.RunState.RESTARTING.value, None, None
            if abort is not None:
                return p.RunState.ABORTING.value, None, None
            return p.RunState.RUNNING.value, None, None
        if phase in p.NOT_STARTED_EXIT:
            state = p.RunState.INTERRUPTED if phase == p.PHASE_INTERRUPTED else p.RunState.NOT_STARTED
            return state.value, p.NOT_STARTED_EXIT[phase], _mtime(os.path.join(self.d, p.META))
        if phase in p.WARMING_PHASES and not beat:  # its launch is gone before training started (status says so too)
            return p.RunState.NOT_STARTED.value, None, _mtime(os.path.join(self.d, p.META))
        name, code = outcome(read_text(os.path.join(self.d, p.EXIT_CODE)), abort, False)
        ends = [_mtime(os.path.join(self.d, n)) for n in (p.EXIT_CODE, p.ABORT_DONE, p.EXIT_CODE_REAPED, p.WATCHDOG)]
        return name.value, code, max((e for e in ends if e is not None), default=None)

    def snapshot(self, now: float, beat: Optional[Dict[str, Any]] = None, live: bool = True,
                 at_scrape: bool = False, read_limit: int = READ_EVERY) -> RunSnapshot:
        """The run now. `beat`: the heartbeat record (read from watchdog.json when not given); `live`: the run
        goes on; `at_scrape`: the heartbeat's age is worked out too (a scrape reads it at once)."""
        beat = beat if beat is not None else read_json(os.path.join(self.d, p.WATCHDOG)) or {}
        tele = _dict(beat, "telemetry")
        base = _dict(tele, "baseline")
        cfg, job = self.cfg, self.cfg.job
        state, code, ended_at = self.state(beat, live)
        attempt = int(beat.get("attempt") or (read_json(os.path.join(self.d, p.ATTEMPT)) or {}).get("attempt") or 1)
        aborts, restarts = self.counts(attempt)
        self.events.read(read_limit)
        stall = _dict(beat, "stall")
        throughput_cfg = cfg.detectors.of("throughput")
        heartbeat_at = _number(beat.get("ts"))
        log_mtime = _mtime(os.path.join(self.d, p.LOG))
        snap = RunSnapshot(
            run=str(self.meta.get("id") or cfg.run or os.path.basename(self.d)),
            target=str(self.meta.get("target") or ""), playbook=str(self.meta.get("playbook") or cfg.playbook or ""),
            node=job.node_name if job is not None else "", node_rank=job.node_rank if job is not None else None,
            session=str(self.meta.get("session") or cfg.session or ""), state=state, attempt=attempt,
            max_attempts=int(beat.get("max_attempts") or cfg.max_attempts), started_at=_number(beat.get("started")),
            ended_at=ended_at, exit_code=code,
            command_exit_code=command_exit_code(read_text(os.path.join(self.d, p.EXIT_CODE))),
            throughput=_number(tele.get("throughput")), throughput_baseline=_number(base.get("throughput")),
            throughput_min_ratio=_number(getattr(throughput_cfg, "min_ratio", None)),
            log_silence_seconds=round(max(0.0, now - log_mtime), 3) if live and log_mtime is not None else None,
            stall_timeout_seconds=_number(stall.get("timeout")) if stall else _number(cfg.stall.timeout),
            heartbeat_at=heartbeat_at,
            heartbeat_age_seconds=round(max(0.0, now - heartbeat_at), 3) if at_scrape and heartbeat_at else None,
            aborts=aborts, restarts=restarts,
            matches=[(r, a, n) for (r, a), n in sorted(self.events.matches.items())],
            notifications=[(w, v, c[0], c[1]) for (w, v), c in sorted(self.events.notified.items())],
            gpus=self.gpus(tele, base, live),
        )
        return snap

    def gpus(self, tele: Dict[str, Any], base: Dict[str, Any], live: bool) -> list:
        """The run's GPUs as last sampled (an ended run's GPUs keep their UUIDs, not their last samples)."""
        samples = _dict(tele, "gpus")
        procs = _dict(tele, "processes")
        levels = _dict(base, "gpu_memory")
        uuids = _dict(tele, "uuids")
        health = _dict(tele, "health")  # GPU -> {counter key: value}
        out = []
        for gpu in sorted(set(self.cfg.gpus) | {int(k) for k in samples if str(k).isdigit()}):
            key = str(gpu)
            mib, util = (list(samples.get(key) or []) + [None, None])[:2]
            out.append(GpuReading(
                gpu=gpu, uuid=str(uuids.get(key) or ""), memory_used_mib=_number(mib) if live else None,
                utilization_pct=_number(util) if live else None,
                processes=int(procs[key]) if live and isinstance(procs.get(key), int) else None,
                memory_baseline_mib=_number(levels.get(key)),
                health={str(k): v for k, v in (health.get(key) or {}).items() if _number(v) is not None}
                if isinstance(health.get(key), dict) else {}))
        return out
