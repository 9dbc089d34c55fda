"""The GPUs' own health as nvidia-smi's query interface reads it: the fields gpuops asks for, and their CSV back
into values. Pure and standard library only: preflight, `gpuops health` and the watchdog's sampler read it here.

Every field and answer is as the real driver gives it (580.159.04, recorded on an H100 80GB HBM3 that the
lender gave when asked for an H200: tests/data/real_h200/health/): counters as integers, `Yes`/`No`,
`Enabled`, the clock-event reasons as a hex mask (`0x0000000000000001`: the GPU is idle), `[N/A]` where a GPU
has no such counter (retired pages on Hopper, which remaps rows), `gpu_recovery_action` `None` when healthy.
A field the driver does not know fails the whole query (`Field "x" is not a valid field to query.`, exit 2:
the `reset_status.*` fields on 580): `without` takes it out (or spells it the older way) and the query is
asked again. A GPU that no longer answers shows as a line `Unable to determine the device handle for GPU...`
and fields such as `[GPU requires reset]` or `[Unknown Error]` (health-notes.md, section 3: field reports,
not seen on the lent machine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .smi import SmiError
from .xid import bus_key

__all__ = ["HEALTH_FIELDS", "LOOP_HEALTH", "GpuHealth", "HealthReading", "LostGpu", "SLOWDOWN", "parse_health",
           "reasons", "refused_field", "without"]

#: What preflight and `gpuops health` read of each GPU (after the probe's own index,uuid,memory,utilization).
HEALTH_FIELDS: Tuple[str, ...] = (
    "pci.bus_id", "name", "ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending",
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
    "clocks_event_reasons.active", "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max", "temperature.gpu", "temperature.memory", "power.draw", "power.limit", "gpu_recovery_action")
#: What the watchdog's sampler adds to each sample (index, memory.used, utilization.gpu): the counters that say
#: a GPU went bad during the run, and who it is.
LOOP_HEALTH: Tuple[str, ...] = (
    "pci.bus_id", "uuid", "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending", "remapped_rows.failure",
    "clocks_event_reasons.active", "gpu_recovery_action")
#: A field an older driver knows only by its older name (the 580 driver takes both: old-throttle-names.txt).
ALIASES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}

#: NVML's clock-event reasons (nvmlClocksEventReason*), the bits of `clocks_event_reasons.active`.
REASONS: Tuple[Tuple[int, str], ...] = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"))
#: The reasons that slow a GPU below what it was asked for: hardware, thermal, power brake. A power cap at full
#: load is normal (`sw_power_cap` `Active` at ~680 W of 700 W: load.txt) and is not one of them.
SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80

_MISSING = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")
_REFUSED = re.compile(r'Field "([^"]+)" is not a valid field to query')
_LOST = re.compile(r"Unable to determine the device handle for GPU\s*(?:\d+:\s+)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
                   r"[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)?[: ]*(.*)")


def refused_field(text: str) -> Optional[str]:
    """The field a query was refused for (`Field "x" is not a valid field to query.`), if that is what it says."""
    m = _REFUSED.search(text or "")
    return m.group(1) if m else None


def without(fields: Sequence[str], refused: str) -> Tuple[str, ...]:
    """The fields with a refused one taken out, or spelled the older way where it has one."""
    alias = ALIASES.get(refused)
    return tuple(alias if f == refused and alias else f for f in fields if f != refused or alias)


def reasons(mask: Optional[int]) -> List[str]:
    """The clock-event reasons a mask holds, by NVML's names."""
    return [] if mask is None else [name for bit, name in REASONS if mask & bit]


@dataclass(frozen=True)
class LostGpu:
    """A GPU nvidia-smi could not open: its bus id as the line names it, and the line."""

    bus_id: Optional[str]
    said: str


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's row: its index and the raw answer of each field asked (by the name gpuops asked it)."""

    index: int
    values: Dict[str, str] = field(default_factory=dict)

    def raw(self, name: str) -> Optional[str]:
        value = self.values.get(name)
        if value is None and name in ALIASES:
            value = self.values.get(ALIASES[name])
        return value

    def _value(self, name: str) -> Optional[str]:
        """The field's text; None where the GPU has no such value (`[N/A]`) or reports an error."""
        value = self.raw(name)
        if value is None or value in _MISSING or value.startswith("["):
            return None
        return value

    def number(self, name: str) -> Optional[float]:
        value = self._value(name)
        if value is None:
            return None
        try:
            return float(value.split()[0])
        except (ValueError, IndexError):
            return None

    def count(self, name: str) -> Optional[int]:
        value = self.number(name)
        return None if value is None else int(value)

    def flag(self, name: str) -> Optional[bool]:
        """A Yes/No field (`remapped_rows.pending`), None where it does not apply."""
        value = self._value(name)
        return None if value is None else value.strip().lower() in ("yes", "true", "active", "1")

    @property
    def errors(self) -> Dict[str, str]:
        """The fields the driver answered with an error (`[GPU requires reset]`, `[Unknown Error]`, ...)."""
        return {k: v for k, v in self.values.items() if v.startswith("[") and v not in _MISSING}

    @property
    def bus_id(self) -> Optional[str]:
        return self._value("pci.bus_id")

    @property
    def bus(self) -> Optional[str]:
        """The bus id in the kernel log's spelling (`0000:3b:00`): how an Xid names this GPU."""
        return bus_key(self.bus_id or "")

    @property
    def uuid(self) -> Optional[str]:
        return self._value("uuid")

    @property
    def mask(self) -> Optional[int]:
        """`clocks_event_reasons.active` as a number."""
        value = self._value("clocks_event_reasons.active")
        try:
            return None if value is None else int(value, 16)
        except ValueError:
            return None

    @property
    def recovery_action(self) -> Optional[str]:
        """`gpu_recovery_action` as the driver said it (`None` when healthy); None where it was not read."""
        return self._value("gpu_recovery_action")

    def link(self) -> Dict[str, Optional[int]]:
        return {"gen": self.count("pcie.link.gen.current"), "gen_max": self.count("pcie.link.gen.max"),
                "width": self.count("pcie.link.width.current"), "width_max": self.count("pcie.link.width.max")}

    def identity(self) -> Dict[str, object]:
        """index, bus id, UUID: how every message names the GPU."""
        return {"index": self.index, "bus_id": self.bus_id, "uuid": self.uuid}

    def as_json(self) -> Dict[str, object]:
        """The counters, slowdown reasons, link and temperatures `gpuops health --json` shows."""
        return {
            **self.identity(), "name": self._value("name"), "ecc_mode": self._value("ecc.mode.current"),
            "ecc": {"uncorrected_volatile": self.count("ecc.errors.uncorrected.volatile.total"),
                    "corrected_volatile": self.count("ecc.errors.corrected.volatile.total"),
                    "uncorrected_aggregate": self.count("ecc.errors.uncorrected.aggregate.total")},
            "retired_pages_pending": self.flag("retired_pages.pending"),
            "remapped_rows": {"correctable": self.count("remapped_rows.correctable"),
                              "uncorrectable": self.count("remapped_rows.uncorrectable"),
                              "pending": self.flag("remapped_rows.pending"),
                              "failure": self.flag("remapped_rows.failure")},
            "clocks_event_reasons": reasons(self.mask), "link": self.link(),
            "temperature": {"gpu": self.number("temperature.gpu"), "memory": self.number("temperature.memory")},
            "power": {"draw": self.number("power.draw"), "limit": self.number("power.limit")},
            "recovery_action": self.recovery_action, "errors": self.errors,
        }


@dataclass
class HealthReading:
    """What one health query gave: each GPU that answered, each one that could not be opened, and the fields
    that were asked (a refused one taken out)."""

    gpus: List[GpuHealth] = field(default_factory=list)
    lost: List[LostGpu] = field(default_factory=list)
    fields: Tuple[str, ...] = ()

    def by_index(self) -> Dict[int, GpuHealth]:
        return {g.index: g for g in self.gpus}


def parse_health(text: str, fields: Sequence[str]) -> HealthReading:
    """`--query-gpu=<fields> --format=csv,noheader[,nounits]` output (fields[0] is `index`) into values.

    A row is a line of exactly len(fields) values whose first is an index; an `Unable to determine the device
    handle` line is a lost GPU. Anything else (a driver that is not loaded, a refused field) is SmiError: text
    that is no table must never read as healthy GPUs."""
    reading = HealthReading(fields=tuple(fields))
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        lost = _LOST.search(line)
        if lost is not None:
            bus = lost.group(1)
            reading.lost.append(LostGpu(bus, line.strip()[:300]))
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields) or not parts[0].isdigit():
            raise SmiError("unexpected nvidia-smi line: %r" % line[:300])
        reading.gpus.append(GpuHealth(int(parts[0]), dict(zip(fields, parts))))
    return reading
