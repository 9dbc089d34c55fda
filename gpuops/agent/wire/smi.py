"""nvidia-smi CSV in, values out: the one parser both the client (preflight, status) and the watchdog use.

Pure and standard library only (it runs on the target). The queries are spelled here as argv lists;
the client wraps them in its own ``Cmd`` values. Real output is in REFERENCE.md and
tests/data/real_h200/nvidia-smi.txt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

__all__ = [
    "APP_FIELDS", "GPU_FIELDS", "SAMPLE_FIELDS", "Gpu", "GpuSample", "Process", "SmiError",
    "parse_gpus", "parse_sample", "sample_argv",
]

GPU_FIELDS = "index,uuid,memory.used,memory.total,utilization.gpu"
APP_FIELDS = "pid,gpu_uuid,used_memory,process_name"
#: The watchdog's per-sample query: cheap, and only the GPUs of the run (``-i 5,6,7``).
SAMPLE_FIELDS = "index,memory.used,utilization.gpu"

#: index -> (memory used MiB, utilisation %); None where nvidia-smi says [N/A].
GpuSample = Dict[int, Tuple[Optional[int], Optional[int]]]

_MISSING = ("[N/A]", "N/A", "[Not Supported]", "")


@dataclass(frozen=True)
class Process:
    pid: int | None
    used_mib: int | None
    name: str


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int | None
    processes: tuple[Process, ...] = field(default=())

    def as_json(self) -> dict[str, object]:
        return {
            "index": self.index,
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "utilization_pct": self.utilization_pct,
            "processes": [{"pid": p.pid, "used_mib": p.used_mib, "name": p.name} for p in self.processes],
        }


class SmiError(ValueError):
    """nvidia-smi printed something that is not the table we asked for."""


def _int(text: str) -> int | None:
    """A field with or without its unit; [N/A] and friends are None, not 0."""
    text = text.strip()
    for unit in (" MiB", " %"):
        if text.endswith(unit):
            text = text[: -len(unit)]
    if text in _MISSING:
        return None
    return int(text)


def _rows(csv: str, width: int) -> Iterable[Tuple[str, List[str]]]:
    """Non-blank lines split into exactly `width` stripped fields, or SmiError (an error text is no table)."""
    for line in csv.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != width:
            raise SmiError(f"unexpected nvidia-smi line: {line!r}")
        yield line, parts


def parse_gpus(gpu_csv: str, apps_csv: str = "") -> list[Gpu]:
    """Parse `--query-gpu` and `--query-compute-apps` CSV (noheader; units optional)."""
    apps = parse_apps(apps_csv)
    gpus: list[Gpu] = []
    for line, parts in _rows(gpu_csv, 5):
        try:
            index, used, total = int(parts[0]), _int(parts[2]), _int(parts[3])
            util = _int(parts[4])
        except ValueError:
            raise SmiError(f"unexpected nvidia-smi line: {line!r}") from None
        gpus.append(Gpu(index, parts[1], used or 0, total or 0, util, tuple(apps.get(parts[1], ()))))
    return gpus


def parse_apps(apps_csv: str) -> dict[str, list[Process]]:
    """`--query-compute-apps=pid,gpu_uuid,used_memory,process_name` CSV: each GPU's processes, by its UUID."""
    apps: dict[str, list[Process]] = {}
    for line in apps_csv.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) != 4:
            raise SmiError(f"unexpected nvidia-smi compute-apps line: {line!r}")
        pid, uuid, used, name = parts
        apps.setdefault(uuid, []).append(Process(_int(pid), _int(used), name))
    return apps


def sample_argv(gpus: Iterable[int]) -> list[str]:
    """The watchdog's per-sample nvidia-smi command, as argv (no shell)."""
    argv = ["nvidia-smi", f"--query-gpu={SAMPLE_FIELDS}", "--format=csv,noheader,nounits"]
    wanted = ",".join(str(int(g)) for g in gpus)
    return argv + (["-i", wanted] if wanted else [])


def parse_sample(csv: str) -> GpuSample:
    """Parse the per-sample query (index, memory.used, utilization.gpu): [N/A] is None, not 0.

    An error text (``No devices were found``, a driver failure) raises SmiError: a sample that
    is not a table must not read as idle GPUs.
    """
    out: GpuSample = {}
    for line, parts in _rows(csv, 3):
        try:
            out[int(parts[0])] = (_int(parts[1]), _int(parts[2]))
        except ValueError:
            raise SmiError(f"unexpected nvidia-smi line: {line!r}") from None
    return out
