"""watch.json: the one module that composes, writes and reads it, and the one home of its defaults.

The client composes a WatchConfig from the playbook at prepare time (gpuops.client.runspec) and
`compose` turns it into the record; the agent's `prepare` writes it into the run directory, and every
agent tool (watchdog, abort, start, notify) reads it here, once, into the same frozen dataclasses and
passes those on: no other agent module reads a key of it. A record an older gpuops wrote still reads:
a missing key gets its default. A default such as the abort's 30 s grace is spelled once, and the
playbook loader (gpuops.config.playbook_model) takes its own defaults from this module (the
detectors' from detector_list.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Optional, Tuple

from . import protocol as p
from .channel_list import Channel, by_kind
from .detector_list import DETECTORS, DetectorSettings
from .records import read_json
from .stackfile import OFF as STACKS_OFF  # noqa: F401
from .stackfile import ON_STALL
from .stackfile import POLICIES as STACKS_POLICIES

#: abort: the signal (a name without SIG) sent to the run first, and the seconds it gets to end.
ABORT_SIGNAL = "INT"
ABORT_GRACE = 30.0
#: stall_timeout: seconds without log growth before the run counts as stalled (0: off).
STALL_TIMEOUT = 900.0
#: stall_timeout: auto, learning the timeout from the run's own gaps between log growths.
STALL_AUTO: Dict[str, float] = {"floor": 30.0, "factor": 5.0, "settle": 60.0, "initial": STALL_TIMEOUT}
#: stacks: when the watchdog records the training's thread stacks before the abort's signal.
STACKS = ON_STALL
#: Seconds between GPU samples.
SAMPLE_INTERVAL = 2.0
#: preflight and the abort's drain: a GPU using more MiB than this is taken for busy.
MAX_MEMORY_USED_MIB = 500
#: restart: seconds between attempts; a warmup's limit per GPU and its drain's.
RESTART_DELAY = 10.0
WARMUP_TIMEOUT = 1200.0
WARMUP_DRAIN = 30.0


@dataclass(frozen=True)
class Abort:
    signal: str = ABORT_SIGNAL
    grace: float = ABORT_GRACE


@dataclass(frozen=True)
class Stall:
    """The stall clock's settings: timeout 0 is off; auto (its keys as given) learns it (watch/stall.py)."""

    timeout: float = STALL_TIMEOUT
    auto: Optional[Dict[str, float]] = None


@dataclass(frozen=True)
class Rule:
    """A playbook rule (watch.rules)."""

    name: str
    pattern: str
    action: str = "abort"


@dataclass(frozen=True)
class Warmup:
    """restart.warmup: the playbook's warmup, run again before a restarted attempt."""

    gpus: Tuple[int, ...] = ()
    command: str = ""
    timeout: float = WARMUP_TIMEOUT
    drain_timeout: float = WARMUP_DRAIN


@dataclass(frozen=True)
class Restart:
    """restart: what the watchdog needs to start training again."""

    max: int = 0
    on: Tuple[str, ...] = ()
    compile_guard: bool = False
    delay: float = RESTART_DELAY
    warmup: bool = False
    warmup_spec: Optional[Warmup] = None


@dataclass(frozen=True)
class Job:
    """One node of a torchrun job (docs/torchrun.md): the job, this node, and the key its end is signed with."""

    id: str = ""
    node_rank: int = 0
    nodes: Tuple[str, ...] = ()
    endpoint: str = ""
    node_name: str = ""
    key: str = field(default="", repr=False)
    flight_recorder: bool = True  # torchrun.flight_recorder: each rank's recorder dumped before a stall's abort


#: watch.metrics.keep_ended: seconds a run's series stay after it ended (its textfile, its Pushgateway group).
METRICS_KEEP_ENDED = 600.0


@dataclass(frozen=True)
class Metrics:
    """watch.metrics (docs/metrics.md): where the watchdog puts the run's series; none set: nowhere."""

    textfile: Optional[str] = None  # node_exporter's textfile collector directory
    pushgateway: Optional[str] = field(default=None, repr=False)  # the Pushgateway's URL (maybe a secret)
    secret: bool = False  # the URL is a secret: never shown or logged
    keep_ended: float = METRICS_KEEP_ENDED

    @property
    def on(self) -> bool:
        return bool(self.textfile or self.pushgateway)


@dataclass(frozen=True)
class WatchConfig:
    """watch.json, typed: everything the watchdog (or a client taking over) needs to watch and stop the run."""

    run: str = ""
    playbook: Optional[str] = None
    session: str = ""
    gpus: Tuple[int, ...] = ()
    max_memory_used_mib: int = MAX_MEMORY_USED_MIB
    abort: Abort = Abort()
    abort_written: bool = True  # False: the record had no `abort` (an abort's own record may say its signal)
    builtin: bool = True
    builtin_rules: Tuple[Tuple[str, str], ...] = ()  # (built-in rule, abort | warn | off)
    rules: Tuple[Rule, ...] = ()
    stall: Stall = Stall()
    sample_interval: float = SAMPLE_INTERVAL
    detectors: DetectorSettings = DetectorSettings(())
    recompiles: bool = False
    env: Dict[str, str] = field(default_factory=dict)
    secrets: Tuple[str, ...] = ()
    restart: Optional[Restart] = None
    stacks: str = STACKS
    notify: Tuple[Channel, ...] = ()  # each channel typed, its kind named (wire/channel_list.py)
    job: Optional[Job] = None
    metrics: Metrics = Metrics()

    @property
    def max_attempts(self) -> int:
        """The first attempt and the restarts after it."""
        return 1 + (self.restart.max if self.restart is not None else 0)


def compose(cfg: WatchConfig) -> Dict[str, Any]:
    """The record, every key named (what `read` reads back into the same WatchConfig)."""
    r, w = cfg.restart, cfg.restart.warmup_spec if cfg.restart is not None else None
    out: Dict[str, Any] = {
        "schema_version": p.SCHEMA_VERSION, "run": cfg.run, "playbook": cfg.playbook, "session": cfg.session,
        "gpus": list(cfg.gpus), "max_memory_used_mib": cfg.max_memory_used_mib,
        "abort": {"signal": cfg.abort.signal, "grace": cfg.abort.grace}, "builtin": cfg.builtin,
        "builtin_rules": dict(cfg.builtin_rules),
        "rules": [{"name": x.name, "pattern": x.pattern, "action": x.action} for x in cfg.rules],
        "stall": {"timeout": cfg.stall.timeout, "auto": cfg.stall.auto}, "sample_interval": cfg.sample_interval,
        "recompiles": cfg.recompiles, "env": dict(cfg.env), "secrets": list(cfg.secrets),
        "restart": None if r is None else {
            "max": r.max, "on": list(r.on), "compile_guard": r.compile_guard, "delay": r.delay, "warmup": r.warmup,
            "warmup_spec": None if w is None else {"gpus": list(w.gpus), "command": w.command, "timeout": w.timeout,
                                                   "drain_timeout": w.drain_timeout}},
        "stacks": cfg.stacks, "notify": [channel_record(c) for c in cfg.notify],
        "metrics": {"textfile": cfg.metrics.textfile, "pushgateway": cfg.metrics.pushgateway,
                    "secret": cfg.metrics.secret, "keep_ended": cfg.metrics.keep_ended},
    }
    for spec in DETECTORS:
        settings = cfg.detectors.of(spec.key)
        out[spec.key] = None if settings is None else spec.plain(settings)
    if cfg.job is not None:  # one node of a torchrun job (docs/torchrun.md)
        j = cfg.job
        out["job"] = {"id": j.id, "node_rank": j.node_rank, "nodes": list(j.nodes), "endpoint": j.endpoint,
                      "node_name": j.node_name, "key": j.key, "flight_recorder": j.flight_recorder}
    return out


def write(d: str, record: Dict[str, Any]) -> None:
    """Into a new run directory, mode 0600 (it holds the secrets the watchdog masks)."""
    fd = os.open(os.path.join(d, p.WATCH), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")


def read(d: str) -> Optional[WatchConfig]:
    """The run's watch.json; None when it is missing or garbled (a record without schema_version is an older run's)."""
    raw = read_json(os.path.join(d, p.WATCH))
    return None if raw is None else parse(raw)


def read_or_default(d: str) -> WatchConfig:
    """The run's watch.json, or every default when it is missing or garbled (a broken record never blocks a stop)."""
    return read(d) or WatchConfig()


def _get(raw: Dict[str, Any], key: str, convert: Callable[[Any], Any], default: Any) -> Any:
    """raw[key] converted; the default when it is missing (or null where `or` says so) or cannot be converted."""
    try:
        return convert(raw[key]) if key in raw else default
    except (TypeError, ValueError, AttributeError, KeyError):
        return default


def _section(raw: Dict[str, Any], key: str) -> Dict[str, Any]:
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def parse(raw: Dict[str, Any]) -> WatchConfig:
    """A decoded watch.json as a WatchConfig: the one reader of its keys."""
    ab, stall = _section(raw, "abort"), _section(raw, "stall")
    return WatchConfig(
        run=str(raw.get("run") or ""), playbook=None if raw.get("playbook") is None else str(raw["playbook"]),
        session=str(raw.get("session") or ""),
        gpus=_get(raw, "gpus", lambda v: tuple(int(g) for g in v or ()), ()),
        max_memory_used_mib=_get(raw, "max_memory_used_mib", int, MAX_MEMORY_USED_MIB),
        abort=Abort(str(ab.get("signal") or ABORT_SIGNAL), _get(ab, "grace", float, ABORT_GRACE)),
        abort_written="abort" in raw,
        builtin=bool(raw.get("builtin", True)),
        builtin_rules=_get(raw, "builtin_rules", lambda v: tuple((str(k), str(a)) for k, a in (v or {}).items()), ()),
        rules=_get(raw, "rules", lambda v: tuple(Rule(str(x["name"]), str(x["pattern"]), str(x.get("action", "abort")))
                                                 for x in v or ()), ()),
        stall=Stall(_get(stall, "timeout", float, STALL_TIMEOUT),
                    _get(stall, "auto", lambda v: None if v is None else {k: float(x) for k, x in v.items()}, None)),
        sample_interval=_get(raw, "sample_interval", lambda v: float(v or SAMPLE_INTERVAL), SAMPLE_INTERVAL),
        detectors=detectors(raw),
        recompiles=bool(raw.get("recompiles")),
        env=_get(raw, "env", lambda v: {str(k): str(x) for k, x in (v or {}).items()}, {}),
        secrets=_get(raw, "secrets", lambda v: tuple(str(x) for x in v or ()), ()),
        restart=_restart(raw.get("restart")),
        stacks=raw["stacks"] if raw.get("stacks") in STACKS_POLICIES else STACKS,
        notify=_get(raw, "notify", lambda v: tuple(channel(c) for c in v or () if isinstance(c, dict)), ()),
        job=_job(raw.get("job")),
        metrics=_metrics(raw.get("metrics")),
    )


def detectors(raw: Dict[str, Any]) -> DetectorSettings:
    """Each detector's section (absent or null: off), its missing keys filled from its spec's defaults."""
    found = []
    for spec in DETECTORS:
        section = raw.get(spec.key)
        settings = None
        if isinstance(section, dict):
            settings = spec.settings(**{k.name: section.get(k.name, k.default) for k in spec.keys})
        found.append((spec.key, settings))
    return DetectorSettings(tuple(found))


def channel_record(c: Channel, shown: bool = False) -> Dict[str, Any]:
    """A channel as watch.json (and notify-test's stdin) carries it: its kind, `on` and its kind's settings
    (`shown`: each secret value as ***, as a dry run prints it)."""
    spec = c.spec
    settings = {} if spec is None or c.settings is None else spec.plain(c.settings, shown)
    return {"kind": c.kind, "on": list(c.on), **settings}


def channel(raw: Dict[str, Any]) -> Channel:
    """A channel's record as a Channel, what it lacks from its kind's defaults. A record an older gpuops wrote
    names no kind: it has the two kinds there were, told apart as that gpuops did (a command if set, else a
    webhook). A kind this gpuops does not know keeps its place with no settings (its deliveries fail, saying so)."""
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind:
        kind = "command" if raw.get("command") else "webhook"
    on = _get(raw, "on", lambda v: tuple(str(x) for x in v or ()), ())
    spec = by_kind(kind)
    return Channel(kind, on, None if spec is None else spec.read(raw))


def _restart(section: Any) -> Optional[Restart]:
    if not isinstance(section, dict):
        return None
    warm = section.get("warmup_spec")
    spec = None if not isinstance(warm, dict) else Warmup(
        _get(warm, "gpus", lambda v: tuple(int(g) for g in v or ()), ()), str(warm.get("command") or ""),
        _get(warm, "timeout", lambda v: float(v or WARMUP_TIMEOUT), WARMUP_TIMEOUT),
        _get(warm, "drain_timeout", lambda v: float(v or WARMUP_DRAIN), WARMUP_DRAIN))
    return Restart(max=_get(section, "max", lambda v: int(v or 0), 0),
                   on=_get(section, "on", lambda v: tuple(str(x) for x in v or ()), ()),
                   compile_guard=bool(section.get("compile_guard")),
                   delay=_get(section, "delay", float, RESTART_DELAY), warmup=bool(section.get("warmup")),
                   warmup_spec=spec)


def _metrics(section: Any) -> Metrics:
    if not isinstance(section, dict):
        return Metrics()
    text = lambda key: str(section[key]) if isinstance(section.get(key), str) and section[key] else None  # noqa: E731
    return Metrics(textfile=text("textfile"), pushgateway=text("pushgateway"), secret=bool(section.get("secret")),
                   keep_ended=_get(section, "keep_ended", float, METRICS_KEEP_ENDED))


def _job(section: Any) -> Optional[Job]:
    if not isinstance(section, dict) or not section:
        return None
    return Job(id=str(section.get("id") or ""), node_rank=_get(section, "node_rank", int, 0),
               nodes=_get(section, "nodes", lambda v: tuple(str(x) for x in v or ()), ()),
               endpoint=str(section.get("endpoint") or ""), node_name=str(section.get("node_name") or ""),
               key=str(section.get("key") or ""), flight_recorder=section.get("flight_recorder") is not False)


def with_session(cfg: WatchConfig, session: str, gpus: Tuple[int, ...]) -> WatchConfig:
    """cfg with the run's session and GPUs as meta.json says them (a garbled watch.json never blocks a stop)."""
    return replace(cfg, session=session, gpus=cfg.gpus or gpus)
