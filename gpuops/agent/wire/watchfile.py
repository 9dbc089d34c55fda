"""watch.json: the one module that composes, writes and reads it, and the one home of its defaults.

The client composes it from the playbook at prepare time (gpuops.client.runspec), the agent's
`prepare` writes it into the run directory, and every agent tool (watchdog, abort, start) reads
its settings here: a default such as the abort's 30 s grace is spelled once, and the playbook
loader (gpuops.config.model) takes its own defaults from this module.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from . import protocol as p
from .records import read_json
from .stackfile import OFF as STACKS_OFF, ON_STALL, POLICIES as STACKS_POLICIES  # noqa: F401

#: The detectors' playbook keys' defaults (a section absent or None is off); detectors.DEFAULTS is this.
DETECTOR_DEFAULTS: Dict[str, Any] = {
    "throughput": {"pattern": None, "min_ratio": 0.5, "baseline": "last", "settle": 60.0, "window": 30.0, "action": "warn"},
    "gpu_memory": {"max_ratio": 1.5, "max_swing_mib": 2048, "baseline": "last", "settle": 60.0, "window": 30.0,
                   "action": "warn"},
    "compile_after_warmup": {"settle": 60.0, "window": 60.0, "action": "warn"},
    "sample_interval": 2.0,
}
#: The metric rules watch.json may carry (their figures feed the detectors, they never abort).
METRIC_THROUGHPUT = "throughput"
METRIC_RECOMPILES = "recompiles"

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
SAMPLE_INTERVAL = float(DETECTOR_DEFAULTS["sample_interval"])
#: preflight and the abort's drain: a GPU using more MiB than this is taken for busy.
MAX_MEMORY_USED_MIB = 500
#: Detector sections: the playbook keys' defaults (a section absent or None is off).
THROUGHPUT: Dict[str, Any] = DETECTOR_DEFAULTS["throughput"]
GPU_MEMORY: Dict[str, Any] = DETECTOR_DEFAULTS["gpu_memory"]
COMPILE_AFTER_WARMUP: Dict[str, Any] = DETECTOR_DEFAULTS["compile_after_warmup"]

#: Every key of watch.json, as compose writes them.
KEYS = ("schema_version", "run", "playbook", "session", "gpus", "max_memory_used_mib", "abort", "builtin",
        "builtin_rules", "rules", "stall", "sample_interval", "throughput", "gpu_memory", "compile_after_warmup",
        "recompiles", "env", "secrets", "restart", "stacks", "notify")


def compose(*, run: str, playbook: str, session: str, gpus: List[int], max_memory_used_mib: int,
            abort: Dict[str, Any], builtin: bool, builtin_rules: Dict[str, str], rules: List[Dict[str, str]],
            stall: Dict[str, Any], sample_interval: float, throughput: Optional[Dict[str, Any]],
            gpu_memory: Optional[Dict[str, Any]], compile_after_warmup: Optional[Dict[str, Any]], recompiles: bool,
            env: Dict[str, str], secrets: List[str], restart: Optional[Dict[str, Any]], stacks: str,
            notify: List[Dict[str, Any]], job: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The record, every key named (a key added on one side and not the other fails here, not on a target)."""
    return {"schema_version": p.SCHEMA_VERSION, "run": run, "playbook": playbook, "session": session, "gpus": gpus,
            "max_memory_used_mib": max_memory_used_mib, "abort": abort, "builtin": builtin,
            "builtin_rules": builtin_rules, "rules": rules, "stall": stall, "sample_interval": sample_interval,
            "throughput": throughput, "gpu_memory": gpu_memory, "compile_after_warmup": compile_after_warmup,
            "recompiles": recompiles, "env": env, "secrets": secrets, "restart": restart, "stacks": stacks,
            "notify": notify,
            **({"job": job} if job else {})}  # one node of a torchrun job (docs/torchrun.md)


def write(d: str, cfg: Dict[str, Any]) -> None:
    """Into a new run directory, mode 0600 (it holds the secrets the watchdog masks)."""
    fd = os.open(os.path.join(d, p.WATCH), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(cfg, sort_keys=True) + "\n")


def read(d: str) -> Optional[Dict[str, Any]]:
    """The run's watch.json; None when it is missing or garbled (a record without schema_version is an older run's)."""
    return read_json(os.path.join(d, p.WATCH))


def abort_settings(cfg: Dict[str, Any]) -> Tuple[str, float]:
    """(signal name, grace seconds) of the run's abort."""
    ab = cfg.get("abort") or {}
    return str(ab.get("signal") or ABORT_SIGNAL), float(ab.get("grace", ABORT_GRACE))


def stacks_policy(cfg: Dict[str, Any]) -> str:
    """watch.stacks: on_stall (the default, also for a run launched before the key), always or off."""
    said = cfg.get("stacks")
    return said if said in STACKS_POLICIES else STACKS


def stall_settings(cfg: Dict[str, Any]) -> Tuple[float, Optional[Dict[str, float]]]:
    """(timeout, auto settings or None) for StallClock; timeout 0 is off."""
    stall = cfg.get("stall") or {}
    return float(stall.get("timeout", STALL_TIMEOUT)), stall.get("auto")


def sample_interval(cfg: Dict[str, Any]) -> float:
    return float(cfg.get("sample_interval") or SAMPLE_INTERVAL)


def notify_channels(cfg: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The run's notification channels (`on`, `webhook` or `command`, `format`, `secret`); [] for none."""
    return [c for c in cfg.get("notify") or [] if isinstance(c, dict)]


def max_memory_used_mib(cfg: Dict[str, Any]) -> int:
    return int(cfg.get("max_memory_used_mib", MAX_MEMORY_USED_MIB))
