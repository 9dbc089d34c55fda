"""What a run exposes to Prometheus: its families (one table), the snapshot they are read from, and `render`.

The one renderer of gpuops' metrics: the watchdog renders its run's snapshot for node_exporter's textfile
collector and the Pushgateway (agent/metrics), and `gpuops metrics` renders the snapshots the agent's `metrics`
tool sends (one JSON object per run, `RunSnapshot.plain`). Standard library only. docs/metrics.md lists every
family with its labels and meaning.

Every series carries the run's labels: `run`, `target`, `playbook`, and `node` (the node's name) on a node of a
torchrun job; a GPU's series also `gpu` (its index, as the target sees it) and `uuid` (as DCGM's `UUID`).
Other labels come from closed vocabularies (a state, a rule name of the run's watch rules, an action, a
notification's what and via); a value that is not a name is exposed as `other`. No label holds free text.

A family per GPU is one row of GPU_FAMILIES; GPU_HEALTH_FAMILIES is where the GPU health counters go (each
a row naming its key in `GpuReading.health`): the renderer and the dashboard need nothing else.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .exposition import Exposition, Family, series_key
from .protocol import RunState

__all__ = ["GPU_FAMILIES", "GPU_HEALTH_FAMILIES", "RUN_FAMILIES", "STATES", "GpuFamily", "GpuReading",
           "RunSnapshot", "render", "vocabulary"]

MIB = 1 << 20
#: Every state a run is exposed in (gpuops_run_state's `state`, one series each: 1 for the current one).
STATES: Tuple[str, ...] = tuple(s.value for s in RunState)
#: What a vocabulary label may hold: a name as gpuops' files allow them (a rule, a notification's what).
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
OTHER = "other"


def vocabulary(value: Any) -> str:
    """A vocabulary label's value: the word, or `other` for anything that is not one (no free text in a label)."""
    return value if isinstance(value, str) and _WORD.match(value) else OTHER


RUN_INFO = Family("gpuops_run_info", "gauge", "A run of gpuops (always 1); its labels describe it.",
                  ("session", "node_rank"))
RUN_STATE = Family("gpuops_run_state", "gauge", "The run's state: 1 for the state it is in, 0 for the others.",
                   ("state",))
RUN_ENDED = Family("gpuops_run_ended", "gauge", "1 once the run has ended (its state is final), else 0.")
ATTEMPT = Family("gpuops_run_attempt", "gauge", "The run's current attempt, from 1 (playbook restart:).")
MAX_ATTEMPTS = Family("gpuops_run_max_attempts", "gauge", "The attempts the run may have: 1 + restart.max.")
STARTED = Family("gpuops_run_start_timestamp_seconds", "gauge", "When the run was launched (Unix time).")
ENDED = Family("gpuops_run_end_timestamp_seconds", "gauge", "When the run ended (Unix time); once it has.")
EXIT_CODE = Family("gpuops_run_exit_code", "gauge",
                   "gpuops' exit code for the run (0 succeeded, 6 failed, 7 aborted by a rule, 8 stalled, ...); "
                   "once it has ended.")
COMMAND_EXIT = Family("gpuops_run_command_exit_code", "gauge",
                      "The training command's own exit status (128+N for signal N); once it has exited.")
THROUGHPUT = Family("gpuops_throughput", "gauge",
                    "The last figure watch.throughput's pattern read from the run's log, in the log's own unit.")
THROUGHPUT_BASELINE = Family("gpuops_throughput_baseline", "gauge",
                             "The throughput the run is judged against: the playbook's or the last good run's.")
THROUGHPUT_MIN_RATIO = Family("gpuops_throughput_min_ratio", "gauge",
                              "watch.throughput.min_ratio: below this share of the baseline is a throughput drop.")
SILENCE = Family("gpuops_log_silence_seconds", "gauge",
                 "Seconds since the run's log last grew, when the watchdog last looked.")
STALL_TIMEOUT = Family("gpuops_stall_timeout_seconds", "gauge",
                       "The stall timeout in force: this long without log output stops the run (0: off).")
HEARTBEAT = Family("gpuops_watchdog_heartbeat_timestamp_seconds", "gauge",
                   "When the run's watchdog last beat (Unix time): time() minus it is the heartbeat's age.")
HEARTBEAT_AGE = Family("gpuops_watchdog_heartbeat_age_seconds", "gauge",
                       "Seconds since the run's watchdog last beat, at the time of the scrape (gpuops metrics only).")
ABORTS = Family("gpuops_aborts_total", "counter",
                "Attempts of the run stopped, by the rule that stopped them (or stall, stop, timeout, interrupt, job).",
                ("rule",))
RESTARTS = Family("gpuops_restarts_total", "counter", "Restarts of the run, by the rule that ended the attempt before.",
                  ("rule",))
MATCHES = Family("gpuops_rule_matches_total", "counter",
                 "Matches of the run's watch rules and detectors reported by its watchdog, by rule and action.",
                 ("rule", "action"))
SENT = Family("gpuops_notifications_sent_total", "counter",
              "Notifications delivered, by what they told and the channel's kind.", ("what", "via"))
FAILED = Family("gpuops_notifications_failed_total", "counter",
                "Notification deliveries that failed for good, by what they told and the channel's kind.",
                ("what", "via"))


@dataclass(frozen=True)
class GpuFamily:
    """One per-GPU family and how its value is read off a GpuReading (None: not measured, no sample)."""

    family: Family
    value: Callable[["GpuReading"], Optional[float]]


def _mib(value: Optional[float]) -> Optional[float]:
    return None if value is None else float(value) * MIB


def _ratio(pct: Optional[float]) -> Optional[float]:
    return None if pct is None else float(pct) / 100.0


@dataclass
class GpuReading:
    """One GPU of the run as its watchdog last sampled it."""

    gpu: int
    uuid: str = ""
    memory_used_mib: Optional[float] = None
    utilization_pct: Optional[float] = None
    processes: Optional[int] = None
    memory_baseline_mib: Optional[float] = None
    health: Dict[str, float] = field(default_factory=dict)  # GPU_HEALTH_FAMILIES' values by their key


GPU_FAMILIES: Tuple[GpuFamily, ...] = (
    GpuFamily(Family("gpuops_gpu_info", "gauge",
                     "A GPU of the run (always 1): joins DCGM's series on uuid (DCGM's UUID label)."), lambda g: 1),
    GpuFamily(Family("gpuops_gpu_memory_used_bytes", "gauge", "A run GPU's memory in use, as the watchdog sampled it."),
              lambda g: _mib(g.memory_used_mib)),
    GpuFamily(Family("gpuops_gpu_utilization_ratio", "gauge",
                     "A run GPU's utilisation (0 to 1), as the watchdog sampled it."), lambda g: _ratio(g.utilization_pct)),
    GpuFamily(Family("gpuops_gpu_compute_processes", "gauge", "Compute processes on a run GPU, as nvidia-smi lists them."),
              lambda g: g.processes),
    GpuFamily(Family("gpuops_gpu_memory_baseline_bytes", "gauge",
                     "A run GPU's memory level in the baseline run (or the playbook's figure)."),
              lambda g: _mib(g.memory_baseline_mib)),
)


def health_family(key: str, name: str, kind: str, help: str) -> GpuFamily:  # noqa: A002
    """A GPU health family read from GpuReading.health[key] (e.g. uncorrected ECC errors, `_total`)."""
    return GpuFamily(Family(name, kind, help), lambda g: g.health.get(key))


#: The GPU health counters and gauges (issue 36): each `health_family(...)`, read from GpuReading.health (the
#: watchdog's heartbeat: agent/detect/quiet_failures.Quiet.counters). The dashboard's GPU health panel shows every
#: family named gpuops_gpu_health_*.
GPU_HEALTH_FAMILIES: Tuple[GpuFamily, ...] = (
    health_family("ecc_uncorrected_volatile", "gpuops_gpu_health_ecc_uncorrected_errors_total", "counter",
                  "Uncorrected ECC errors of a run GPU since its driver loaded (ecc.errors.uncorrected.volatile.total)."),
    health_family("remap_pending", "gpuops_gpu_health_row_remap_pending", "gauge",
                  "1 while a run GPU has a row remap pending (a GPU reset applies it), else 0."),
    health_family("remap_failure", "gpuops_gpu_health_row_remap_failure", "gauge",
                  "1 once a row remap of a run GPU failed (NVIDIA's RMA criterion), else 0."),
    health_family("recovery_action", "gpuops_gpu_health_recovery_action_needed", "gauge",
                  "1 while the driver asks for a recovery action for a run GPU (gpu_recovery_action not None), else 0."),
    health_family("slowdown", "gpuops_gpu_health_slowdown", "gauge",
                  "1 while a hardware, thermal or power-brake slowdown holds a run GPU's clocks down, else 0."),
    health_family("field_errors", "gpuops_gpu_health_field_errors", "gauge",
                  "Health fields nvidia-smi reads as an error for a run GPU ([GPU requires reset], [Unknown Error])."),
    health_family("xids", "gpuops_gpu_health_xids_total", "counter",
                  "Xids the host's kernel log showed on a run GPU during the run (watch.host_kernel_log)."),
)

RUN_FAMILIES: Tuple[Family, ...] = (
    RUN_INFO, RUN_STATE, RUN_ENDED, ATTEMPT, MAX_ATTEMPTS, STARTED, ENDED, EXIT_CODE, COMMAND_EXIT, THROUGHPUT,
    THROUGHPUT_BASELINE, THROUGHPUT_MIN_RATIO, SILENCE, STALL_TIMEOUT, HEARTBEAT, HEARTBEAT_AGE, ABORTS, RESTARTS,
    MATCHES, SENT, FAILED,
)


@dataclass
class RunSnapshot:
    """What one run (one node of a torchrun job) shows now: read off its records by agent/metrics/reading.py."""

    run: str
    target: str = ""
    playbook: str = ""
    node: str = ""  # a node of a torchrun job: its name (an inventory target)
    node_rank: Optional[int] = None
    session: str = ""
    state: str = RunState.RUNNING.value
    attempt: int = 1
    max_attempts: int = 1
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    exit_code: Optional[int] = None
    command_exit_code: Optional[int] = None
    throughput: Optional[float] = None
    throughput_baseline: Optional[float] = None
    throughput_min_ratio: Optional[float] = None
    log_silence_seconds: Optional[float] = None
    stall_timeout_seconds: Optional[float] = None
    heartbeat_at: Optional[float] = None
    heartbeat_age_seconds: Optional[float] = None  # at the time of the scrape: gpuops metrics only
    aborts: Dict[str, int] = field(default_factory=dict)  # rule -> attempts it stopped
    restarts: Dict[str, int] = field(default_factory=dict)  # rule -> restarts after it
    matches: List[Tuple[str, str, int]] = field(default_factory=list)  # (rule, action, count)
    notifications: List[Tuple[str, str, int, int]] = field(default_factory=list)  # (what, via, sent, failed)
    gpus: List[GpuReading] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        try:
            return RunState(self.state).is_terminal()
        except ValueError:
            return False

    def labels(self) -> Dict[str, Any]:
        """The labels every series of the run carries."""
        return {"run": self.run, "target": self.target, "playbook": self.playbook, "node": self.node}

    def plain(self) -> Dict[str, Any]:
        """As JSON (the `metrics` tool's line, `gpuops metrics --json`'s object)."""
        out = asdict(self)
        out["matches"] = [{"rule": r, "action": a, "count": n} for r, a, n in self.matches]
        out["notifications"] = [{"what": w, "via": v, "sent": s, "failed": f} for w, v, s, f in self.notifications]
        return out

    @classmethod
    def from_plain(cls, raw: Dict[str, Any]) -> "RunSnapshot":
        """A `plain` object read back (unknown keys are a newer agent's: left out)."""
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        snap = cls(**known)
        snap.aborts = {str(k): int(v) for k, v in (raw.get("aborts") or {}).items()}
        snap.restarts = {str(k): int(v) for k, v in (raw.get("restarts") or {}).items()}
        snap.matches = [(str(m["rule"]), str(m["action"]), int(m["count"])) for m in raw.get("matches") or ()]
        snap.notifications = [(str(n["what"]), str(n["via"]), int(n["sent"]), int(n["failed"]))
                              for n in raw.get("notifications") or ()]
        snap.gpus = [GpuReading(**{k: g[k] for k in GpuReading.__dataclass_fields__ if k in g})
                     for g in raw.get("gpus") or ()]
        return snap


def _add_run(out: Exposition, s: RunSnapshot) -> None:
    base = s.labels()
    out.add(RUN_INFO, {**base, "session": s.session, "node_rank": s.node_rank}, 1)
    for state in STATES:
        out.add(RUN_STATE, {**base, "state": state}, 1 if state == s.state else 0)
    out.add(RUN_ENDED, base, 1 if s.ended else 0)
    out.add(ATTEMPT, base, s.attempt)
    out.add(MAX_ATTEMPTS, base, s.max_attempts)
    out.add(STARTED, base, s.started_at)
    if s.ended:
        out.add(ENDED, base, s.ended_at)
        out.add(EXIT_CODE, base, s.exit_code)
    out.add(COMMAND_EXIT, base, s.command_exit_code)
    out.add(THROUGHPUT, base, s.throughput)
    out.add(THROUGHPUT_BASELINE, base, s.throughput_baseline)
    out.add(THROUGHPUT_MIN_RATIO, base, s.throughput_min_ratio)
    out.add(SILENCE, base, s.log_silence_seconds)
    out.add(STALL_TIMEOUT, base, s.stall_timeout_seconds)
    out.add(HEARTBEAT, base, s.heartbeat_at)
    out.add(HEARTBEAT_AGE, base, s.heartbeat_age_seconds)
    tallies = (
        (ABORTS, [((vocabulary(r),), n) for r, n in s.aborts.items()]),
        (RESTARTS, [((vocabulary(r),), n) for r, n in s.restarts.items()]),
        (MATCHES, [((vocabulary(r), vocabulary(a)), n) for r, a, n in s.matches]),
    )
    for family, counts in tallies:
        for key, n in sorted(_sum(counts).items()):
            out.add(family, {**base, **dict(zip(family.labels, key))}, n)
    sent = _sum(((vocabulary(w), vocabulary(v)), n) for w, v, n, _ in s.notifications)
    failed = _sum(((vocabulary(w), vocabulary(v)), n) for w, v, _, n in s.notifications)
    for key in sorted(sent):
        out.add(SENT, {**base, **dict(zip(SENT.labels, key))}, sent[key])
        out.add(FAILED, {**base, **dict(zip(FAILED.labels, key))}, failed[key])


def _sum(pairs: Any) -> Dict[Tuple[str, ...], int]:
    """Counts by their labels as exposed: two rules exposed as `other` are one series, their sum."""
    out: Dict[Tuple[str, ...], int] = {}
    for key, n in pairs:
        out[key] = out.get(key, 0) + int(n)
    return out


def _add_gpus(out: Exposition, s: RunSnapshot, table: Sequence[GpuFamily]) -> None:
    """Every family of the table for each GPU, the GPU's labels made a series key once (not once a family)."""
    base = s.labels()
    gpus = sorted(s.gpus, key=lambda g: g.gpu)
    keys = [series_key({**base, "gpu": str(int(g.gpu)), "uuid": g.uuid}) for g in gpus]
    for row in table:
        for g, key in zip(gpus, keys):
            out.add_keyed(row.family, key, row.value(g))


def render(snapshots: Sequence[RunSnapshot]) -> str:
    """The exposition of these runs: each family once, with every run's series (a run's own once, whatever
    it was given twice)."""
    out = Exposition()
    for s in snapshots:
        _add_run(out, s)
    for s in snapshots:
        _add_gpus(out, s, GPU_FAMILIES + GPU_HEALTH_FAMILIES)
    return out.render()
