"""nvidia-smi queries and parsing, and the one question that matters: is this GPU idle."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuops.command import Cmd

GPU_FIELDS = "index,uuid,memory.used,memory.total,utilization.gpu"
APP_FIELDS = "pid,gpu_uuid,used_memory,process_name"

QUERY_GPUS = Cmd("nvidia-smi", f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits")
QUERY_APPS = Cmd("nvidia-smi", f"--query-compute-apps={APP_FIELDS}", "--format=csv,noheader,nounits")


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
    text = text.strip()
    for unit in (" MiB", " %"):
        if text.endswith(unit):
            text = text[: -len(unit)]
    if text in ("[N/A]", "N/A", "[Not Supported]", ""):
        return None
    return int(text)


def parse_gpus(gpu_csv: str, apps_csv: str = "") -> list[Gpu]:
    """Parse `--query-gpu` and `--query-compute-apps` CSV (noheader; units optional)."""
    apps: dict[str, list[Process]] = {}
    for line in apps_csv.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) != 4:
            raise SmiError(f"unexpected nvidia-smi compute-apps line: {line!r}")
        pid, uuid, used, name = parts
        apps.setdefault(uuid, []).append(Process(_int(pid), _int(used), name))
    gpus: list[Gpu] = []
    for line in gpu_csv.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            raise SmiError(f"unexpected nvidia-smi line: {line!r}")
        try:
            index, used, total = int(parts[0]), _int(parts[2]), _int(parts[3])
            util = _int(parts[4])
        except ValueError:
            raise SmiError(f"unexpected nvidia-smi line: {line!r}") from None
        gpus.append(Gpu(index, parts[1], used or 0, total or 0, util, tuple(apps.get(parts[1], ()))))
    return gpus


@dataclass(frozen=True)
class Finding:
    """One GPU measured against the preflight thresholds."""

    index: int
    memory_used_mib: int | None
    utilization_pct: int | None
    processes: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_idle(
    gpus: list[Gpu], wanted: tuple[int, ...], *, max_memory_mib: int, max_util_pct: int, allow_processes: bool
) -> list[Finding]:
    """Each wanted GPU against the thresholds; a GPU nvidia-smi does not list is a problem."""
    by_index = {g.index: g for g in gpus}
    findings: list[Finding] = []
    for index in wanted:
        gpu = by_index.get(index)
        if gpu is None:
            findings.append(Finding(index, None, None, 0, (f"GPU {index} not found (nvidia-smi lists {sorted(by_index)})",)))
            continue
        problems: list[str] = []
        if gpu.memory_used_mib > max_memory_mib:
            problems.append(f"{gpu.memory_used_mib} MiB used > {max_memory_mib} MiB")
        if gpu.utilization_pct is not None and gpu.utilization_pct > max_util_pct:
            problems.append(f"utilisation {gpu.utilization_pct}% > {max_util_pct}%")
        if gpu.processes and not allow_processes:
            problems.append(f"{len(gpu.processes)} compute process(es) running")
        findings.append(Finding(index, gpu.memory_used_mib, gpu.utilization_pct, len(gpu.processes), tuple(problems)))
    return findings
