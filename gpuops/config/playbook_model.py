"""The playbook as validated values (preflight, warmup, launch, watch, restart, abort): what the rest of gpuops
reads, never raw YAML. Defaults the agent also uses come from gpuops/agent/wire/watchfile.py, spelled there once
(the detectors': gpuops/agent/wire/detector_list.py). A `notify:` channel is the wire's Channel (its kind named,
its settings typed: gpuops/agent/wire/channel_list.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from gpuops.agent.wire import watchfile as wf
from gpuops.agent.wire.channel_list import Channel
from gpuops.agent.wire.detector_list import DETECTORS, DetectorSettings
from gpuops.position import Mark

SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


@dataclass(frozen=True)
class EnvVar:
    """One exported variable; a secret one is shown as *** everywhere."""

    name: str
    value: str
    secret: bool = False
    from_env: str | None = field(default=None, compare=False)  # the local variable it is read from


#: preflight.health: refuse a GPU that needs a reset or service (strict), only warn (warn), or read no health (off).
HEALTH_MODES = ("strict", "warn", "off")
#: watch.host_kernel_log: follow the host's kernel log for the run's Xids where the host user can read it, or not.
HOST_LOG_MODES = ("auto", "off")


@dataclass(frozen=True)
class Preflight:
    gpus: tuple[int, ...] = ()
    max_memory_used_mib: int = wf.MAX_MEMORY_USED_MIB
    max_utilization_pct: int = 10
    allow_processes: bool = False
    health: str = "strict"  # HEALTH_MODES (docs/health.md)
    xid_window: float = 3600.0  # seconds back in the host's kernel log an Xid that needs a reset refuses the GPU; 0: off
    gpus_mark: Mark | None = field(default=None, compare=False)  # where gpus is written


@dataclass(frozen=True)
class Warmup:
    gpus: tuple[int, ...]
    command: str
    timeout: float = 1200.0  # seconds, per GPU
    drain_timeout: float = 120.0  # seconds for a GPU's memory to drain after its warmup
    gpus_mark: Mark | None = field(default=None, compare=False)  # where gpus is written


@dataclass(frozen=True)
class Torchrun:
    """launch.torchrun: how torchrun starts the job on every node (docs/torchrun.md)."""

    nproc_per_node: int = 1
    port: int = 29400  # the c10d rendezvous port on node 0 (torchrun's default)
    collective_timeout: float | None = None  # seconds; None: the stall timeout + a margin (client/nodes.py timeouts)
    async_error_handling: bool = True  # TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless the playbook's env sets it
    flight_recorder: bool = True  # TORCH_FR_BUFFER_SIZE set unless the env sets it; ranks' recorders dumped on a stall


@dataclass(frozen=True)
class Launch:
    session: str
    command: str
    compile_guard: bool = False  # warmup and training run under gpuops' compile guard (docs/compile-guard.md)
    nodes: tuple[str, ...] = ()  # one job over these targets, node 0 first (docs/torchrun.md)
    torchrun: Torchrun | None = None  # set exactly when nodes is
    node_marks: tuple[Mark, ...] = field(default=(), compare=False)  # where each node is written


@dataclass(frozen=True)
class RuleSpec:
    """A playbook watch rule: a Python regular expression searched in each log line."""

    name: str
    pattern: str
    action: Literal["abort", "warn"] = "abort"


@dataclass(frozen=True)
class StallAuto:
    """stall_timeout: auto learns the timeout from this run's gaps between log growths (README, watch)."""

    floor: float = wf.STALL_AUTO["floor"]
    factor: float = wf.STALL_AUTO["factor"]
    settle: float = wf.STALL_AUTO["settle"]
    initial: float = wf.STALL_AUTO["initial"]


@dataclass(frozen=True)
class Metrics:
    """watch.metrics (docs/metrics.md): where the watchdog puts the run's series for Prometheus."""

    textfile: str | None = None  # node_exporter's textfile collector directory on the target
    pushgateway: str | None = field(default=None, repr=False)  # the Pushgateway's URL (a secret one is in secrets)
    secret: bool = False  # the URL is a secret: never shown or logged
    from_env: str | None = field(default=None, compare=False)  # the local variable the URL is read from
    keep_ended: float = wf.METRICS_KEEP_ENDED  # seconds an ended run's series stay


@dataclass(frozen=True)
class Watch:
    builtin: bool = True
    rules: tuple[RuleSpec, ...] = ()
    stall_timeout: float = wf.STALL_TIMEOUT  # 0 = off; with stall_auto, the initial timeout
    builtin_rules: tuple[tuple[str, str], ...] = ()  # (built-in rule name, abort | warn | off), as written
    stall_auto: StallAuto | None = None  # set when stall_timeout: auto
    sample_interval: float = wf.SAMPLE_INTERVAL  # seconds between GPU samples
    # Each quiet-failure detector's settings (None: absent; action off: turned off), as its entry in
    # gpuops/agent/wire/detector_list.py declares them; the ones on by default are on.
    detectors: DetectorSettings = field(default_factory=lambda: DetectorSettings(tuple(
        (spec.key, spec.defaults() if spec.default_on else None) for spec in DETECTORS)))
    recompiles: bool = False  # the run gets TORCH_LOGS=recompiles
    stacks: str = wf.STACKS  # on_stall | always | off: thread stacks recorded before the abort's signal
    host_kernel_log: str = "auto"  # HOST_LOG_MODES: the host's kernel-log follower for the run's Xids (docs/health.md)
    metrics: Metrics = field(default_factory=Metrics)  # watch.metrics: textfile, pushgateway, keep_ended


@dataclass(frozen=True)
class Restart:
    """playbook `restart:`: the watchdog starts training again after an attempt ends by a rule in `on`."""

    max: int = 0  # restarts after the first attempt (0..10)
    on: tuple[str, ...] = ()  # rule names (built-in, playbook, detector), `stall`, `failed`
    compile_guard: bool | None = None  # the restarted attempts run with the guard; None: as launch.compile_guard
    delay: float = 10.0  # seconds between the end of an attempt and the next
    warmup: bool = False  # run the warmup again before a restart
    command: str | None = None  # what restarted attempts run; None: launch.command


@dataclass(frozen=True)
class Abort:
    signal: str = wf.ABORT_SIGNAL  # a signal name without SIG
    grace: float = wf.ABORT_GRACE


@dataclass(frozen=True)
class Playbook:
    """One training job: what to check, warm up, start and watch."""

    path: str
    name: str
    launch: Launch
    target: str | None = None
    workdir: str | None = None
    env: tuple[EnvVar, ...] = ()
    preflight: Preflight = field(default_factory=Preflight)
    warmup: Warmup | None = None
    watch: Watch = field(default_factory=Watch)
    abort: Abort = field(default_factory=Abort)
    restart: Restart | None = None  # None: no restarts
    notify: tuple[Channel, ...] = ()  # where the watchdog tells the operator what happened (docs/notify.md)
    target_mark: Mark | None = None
    warnings: tuple[str, ...] = ()  # "FILE:LINE:COL: message": fine to run, worth a look (validate, launch)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values that must never be shown."""
        hooks = [value for c in self.notify for value in c.secrets()]
        if self.watch.metrics.secret and self.watch.metrics.pushgateway:
            hooks.append(self.watch.metrics.pushgateway)
        # A secret URL also without its scheme: an error text may quote it as host/path.
        hooks += [h.split("://", 1)[1] for h in hooks if "://" in h]
        return tuple(v.value for v in self.env if v.secret and v.value) + tuple(hooks)
