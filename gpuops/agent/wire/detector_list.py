"""The quiet-failure detectors, each declared once, as data both sides read.

A detector is one DetectorSpec in DETECTORS: its playbook key under `watch:` (also its key in
watch.json), the rules and notes it reports, each of its keys (type, default, range, choices: the
playbook loader validates them from here, `gpuops schema` and the docs name them), its default action
(its `action` key's default), whether `restart.on` may name its rules, what the report plots for it,
and the agent module that judges it (gpuops/agent/detect/<module>.py, class `Detector`, found by that
name as an Ansible plugin is found by its file). The config loader, watch.json (watchfile), the
watchdog, restarts, the JSON schema and the report all derive from this list: a new detector is its
own module plus one entry here (docs/architecture.md). Standard library only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Tuple

__all__ = ["DETECTORS", "DetectorSpec", "Key", "NO_BASELINE", "Plot", "DetectorSettings", "by_key", "finding_key",
           "hardware_rules", "rules", "notes", "restartable"]

#: What a key's value is (the playbook loader's reader for it, gpuops/config/keys/watch.py):
#: seconds (> 0), number (strictly between `above` and `below`), integer (>= `least`), pattern (a Python
#: regex with at least `groups` groups), baseline (`last` or a number > 0, in `unit`), action (one of the
#: detector's actions), text (a non-empty string).
KINDS = ("seconds", "number", "integer", "pattern", "baseline", "action", "text")

#: The note a detector judged against a baseline reports, once, when the run has none (detect/detectors.py).
NO_BASELINE = "no-baseline"


@dataclasses.dataclass(frozen=True)
class Key:
    """One playbook key of a detector (`watch.<detector>.<name>`)."""

    name: str
    kind: str
    default: Any = None
    doc: str = ""  # what it means (docs, `gpuops schema`)
    what: str = ""  # how an error message names the value it expects ("a ratio")
    above: Optional[float] = None  # number: strictly above
    below: Optional[float] = None  # number: strictly below
    least: int = 0  # integer: at least
    groups: int = 0  # pattern: the groups it must have (the first is the figure)
    no_group: str = ""  # pattern: what to do when it has fewer
    unit: str = ""  # baseline: the unit of its number
    env: Optional[str] = None  # text: the default is this variable of the playbook's env, when set
    window: bool = False  # seconds: a window judged over, so it must span two samples (watch.sample_interval)
    required: bool = False  # the section needs it (no default)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError("key %r: kind must be one of %s" % (self.name, ", ".join(KINDS)))


@dataclasses.dataclass(frozen=True)
class Plot:
    """A chart the report draws for a detector: a telemetry series (`throughput`: the figure the log prints;
    `memory`: GPU memory used, a line per GPU) with the baseline level of the same name, if any."""

    title: str
    unit: str
    series: str
    empty: str = ""  # what the chart says when it has no points


@dataclasses.dataclass(frozen=True)
class DetectorSpec:
    """One detector (see the module docstring)."""

    key: str  # watch.<key> in the playbook, <key> in watch.json
    module: str  # gpuops/agent/detect/<module>.py judges it
    rules: Tuple[str, ...]  # what its findings are reported as (a `match`)
    keys: Tuple[Key, ...]
    doc: str = ""
    notes: Tuple[str, ...] = ()  # what it says once, as a `note`, never an action
    actions: Tuple[str, ...] = ("warn", "abort")  # what its `action` key may say (order: as messages list them)
    default_on: bool = False  # it judges every run whose playbook does not turn it off
    switch: bool = False  # `true` / `false` may stand for its section
    restart: bool = True  # restart.on may name its rules
    baseline: Optional[str] = None  # the profile's level its `baseline` key gives (throughput | gpu_memory)
    hardware: bool = False  # its findings are a GPU's own failure: a run it ends is `hardware`, exit 10
    heartbeat: Tuple[str, ...] = ()  # keys the watchdog's heartbeat carries in its telemetry (status reads them)
    plot: Optional[Plot] = None

    def __post_init__(self) -> None:
        names = [k.name for k in self.keys]
        if "action" not in names or len(set(names)) != len(names):
            raise ValueError("detector %r: an `action` key, and each key once" % self.key)
        fields: List[Any] = [(k.name, Any) for k in self.keys if k.required]
        fields += [(k.name, Any, dataclasses.field(default=k.default)) for k in self.keys if not k.required]
        cls = dataclasses.make_dataclass(_camel(self.key) + "Settings", fields, frozen=True)
        cls.__doc__ = "The settings of watch.%s (gpuops/agent/wire/detector_list.py)." % self.key
        object.__setattr__(self, "settings", cls)

    settings: Any = dataclasses.field(init=False, repr=False, compare=False)  # the class of its settings

    def key_of(self, name: str) -> Key:
        return next(k for k in self.keys if k.name == name)

    def defaults(self, env: Optional[Dict[str, str]] = None) -> Any:
        """Its settings when the playbook gives none (env: the playbook's, for keys read from it)."""
        given = {k.name: (env or {}).get(k.env) for k in self.keys if k.env and (env or {}).get(k.env)}
        return self.settings(**given)

    def plain(self, settings: Any) -> Dict[str, Any]:
        """Its settings as watch.json carries them."""
        return {k.name: getattr(settings, k.name) for k in self.keys}


def _camel(key: str) -> str:
    return "".join(part.title() for part in key.split("_"))


@dataclasses.dataclass(frozen=True)
class DetectorSettings:
    """The detectors of one playbook or run: each one's settings (None: off), in the list's order."""

    settings: Tuple[Tuple[str, Any], ...]

    def of(self, key: str) -> Any:
        """The settings of the detector under `key` (None: off, or no such detector)."""
        return next((s for k, s in self.settings if k == key), None)

    def on(self) -> Iterator[Tuple[DetectorSpec, Any]]:
        """The detectors that judge, with their settings."""
        for spec in DETECTORS:
            settings = self.of(spec.key)
            if settings is not None and getattr(settings, "action", None) != "off":
                yield spec, settings


def _seconds(name: str, default: float, doc: str, window: bool = False) -> Key:
    return Key(name, "seconds", default, doc, window=window)


SETTLE = "seconds after training starts before it judges"
WINDOW = "seconds it judges over (at least two samples)"

#: The detectors, in the order they judge (and the config loader reads their keys).
DETECTORS: Tuple[DetectorSpec, ...] = (
    DetectorSpec(
        "throughput", "throughput_drop", ("throughput-drop",), notes=("no-throughput",),
        doc="the run's throughput, read from its log, fell against the baseline", baseline="throughput",
        keys=(
            Key("pattern", "pattern", doc="a Python regular expression whose first group is the figure",
                what="a Python regular expression whose first group is the figure", groups=1,
                no_group="put the figure in parentheses, e.g. 'tok/s ([0-9.]+)'", required=True),
            Key("min_ratio", "number", 0.5, "a drop: the median figure is below min_ratio x the baseline",
                what="a ratio", above=0, below=1),
            Key("baseline", "baseline", None, "last (the last successful run's) or a figure"),
            _seconds("settle", 60.0, SETTLE),
            _seconds("window", 30.0, WINDOW, window=True),
            Key("action", "action", "warn", "what a drop does"),
        ),
        plot=Plot("Throughput (the figure the log prints)", "figure / s", "throughput",
                  empty="no throughput figures: set watch.throughput.pattern")),
    DetectorSpec(
        "gpu_memory", "gpu_memory", ("gpu-memory-shift", "gpu-memory-volatile"), actions=("warn", "abort", "off"),
        doc="a GPU's memory left its baseline level, or swings", default_on=True, switch=True,
        baseline="gpu_memory", heartbeat=("max_swing_mib",),
        keys=(
            Key("max_ratio", "number", 1.5, "a shift: the steady level is above max_ratio x the baseline, or below "
                "it / max_ratio", what="a ratio", above=1),
            Key("max_swing_mib", "integer", 2048, "a swing: memory moving by more than this many MiB",
                what="a number of MiB", least=1),
            Key("baseline", "baseline", None, "last (the last successful run's) or MiB", unit="MiB"),
            _seconds("settle", 60.0, SETTLE),
            _seconds("window", 30.0, WINDOW, window=True),
            Key("action", "action", "warn", "what a shift or a swing does"),
        ),
        plot=Plot("GPU memory used", "MiB", "memory")),
    DetectorSpec(
        "compile_after_warmup", "compile_after_warmup", ("compile-after-warmup",), notes=("cache-shared",),
        actions=("warn", "abort", "off"), doc="new inductor cache files or recompiles after training started",
        default_on=True, switch=True,
        keys=(
            _seconds("settle", 60.0, SETTLE),
            Key("action", "action", "warn", "what a compile after warmup does"),
            Key("cache_dir", "text", None, "the inductor cache (default: the env's TORCHINDUCTOR_CACHE_DIR, else "
                "/tmp/torchinductor_<user>)", what="a directory (the inductor cache)", env="TORCHINDUCTOR_CACHE_DIR"),
        )),
    DetectorSpec(
        "slow_node", "slow_node", ("slow-node",), actions=("warn", "abort", "off"), default_on=True, switch=True,
        doc="a node of a torchrun job whose throughput (the figure watch.throughput.pattern reads) sits below the "
            "other nodes' for a window, named",
        keys=(
            Key("min_ratio", "number", 0.7, "slow: this node's median figure is below min_ratio x the median of the "
                "other nodes'", what="a ratio", above=0, below=1),
            _seconds("settle", 60.0, SETTLE),
            _seconds("window", 60.0, WINDOW, window=True),
            Key("action", "action", "warn", "what a slow node does"),
        )),
    DetectorSpec(
        "gpu_xid", "gpu_xid", ("gpu-xid",), actions=("abort", "warn", "off"), default_on=True, switch=True,
        restart=False, hardware=True,
        doc="an Xid on a GPU of the run in the host's kernel log (watch.host_kernel_log): one that needs a reset or "
            "more (NVIDIA's Xid catalog) takes its action, one of the application's (restart the application) warns",
        keys=(Key("action", "action", "abort", "what an Xid that needs a reset or more does"),)),
    DetectorSpec(
        "gpu_ecc", "gpu_ecc", ("gpu-ecc",), actions=("abort", "warn", "off"), default_on=True, switch=True,
        restart=False, hardware=True,
        doc="new uncorrected ECC errors on a GPU of the run, a row remap pending or failed, or a recovery action the "
            "driver asks for (gpu_recovery_action)",
        keys=(Key("action", "action", "abort", "what a new uncorrected error, remap or recovery action does"),)),
    DetectorSpec(
        "gpu_lost", "gpu_lost", ("gpu-lost",), actions=("abort", "warn", "off"), default_on=True, switch=True,
        restart=False, hardware=True,
        doc="a GPU of the run stops answering (nvidia-smi cannot open it, or reads its fields as an error) or "
            "disappears from the samples for `window` seconds",
        keys=(_seconds("window", 30.0, "seconds a GPU may be missing from the samples (two at least) before it "
                       "counts as lost"),
              Key("action", "action", "abort", "what a lost GPU does"))),
    DetectorSpec(
        "gpu_slowdown", "gpu_slowdown", ("gpu-slowdown",), actions=("warn", "abort", "off"), default_on=True,
        switch=True, restart=False, hardware=True,
        doc="a hardware, thermal or power-brake slowdown of a GPU of the run in every sample for `window` seconds",
        keys=(_seconds("window", 60.0, "seconds the slowdown must last (two samples at least)"),
              Key("action", "action", "warn", "what a sustained slowdown does"))),
)


def by_key(key: str) -> DetectorSpec:
    return next(spec for spec in DETECTORS if spec.key == key)


def rules() -> Tuple[str, ...]:
    """Every rule a detector reports a finding as."""
    return tuple(rule for spec in DETECTORS for rule in spec.rules)


def notes() -> Tuple[str, ...]:
    """Every note a detector says (no-baseline for the ones judged against a baseline)."""
    said = [NO_BASELINE] if any(spec.baseline for spec in DETECTORS) else []
    return tuple(said + [note for spec in DETECTORS for note in spec.notes])


def restartable() -> Dict[str, DetectorSpec]:
    """The detector rules restart.on may name, and whose they are."""
    return {rule: spec for spec in DETECTORS if spec.restart for rule in spec.rules}


def hardware_rules() -> Tuple[str, ...]:
    """The rules of the GPUs' own health: a run one of them ends is `hardware` (exit 10), never restarted onto."""
    return tuple(rule for spec in DETECTORS if spec.hardware for rule in spec.rules)


def finding_key(rule: Any, figures: Optional[Dict[str, Any]]) -> Tuple[Any, ...]:
    """What a finding is reported once per (per attempt): its rule and GPU, and its Xid or counter where it has one
    (two Xids on one GPU are two findings)."""
    figures = figures or {}
    return (rule, figures.get("gpu"), figures.get("xid") or figures.get("counter"))
