"""nvidia-smi queries and the one question that matters: is this GPU idle (parsing: gpuops.agent.wire.smi)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuops.agent.wire.smi import APP_FIELDS, GPU_FIELDS, Gpu, Process, SmiError, parse_gpus
from gpuops.command import Cmd

__all__ = ["APP_FIELDS", "GPU_FIELDS", "QUERY_APPS", "QUERY_GPUS", "GpuCheck", "Gpu", "Process", "SmiError",
           "check_idle", "parse_gpus"]

QUERY_GPUS = Cmd("nvidia-smi", f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits")
QUERY_APPS = Cmd("nvidia-smi", f"--query-compute-apps={APP_FIELDS}", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class GpuCheck:
    """One GPU measured against the preflight thresholds (and, where its health was read, its verdict)."""

    index: int
    memory_used_mib: int | None
    utilization_pct: int | None
    processes: int
    problems: tuple[str, ...]
    bus_id: str | None = None
    uuid: str | None = None
    verdict: str | None = None  # ok | warn | needs reset | needs service (agent/wire/verdict.py)
    health: tuple[dict[str, Any], ...] = ()  # each cause: counter, value, level, message, action

    @property
    def ok(self) -> bool:
        return not self.problems


def check_idle(
    gpus: list[Gpu], wanted: tuple[int, ...], *, max_memory_mib: int, max_util_pct: int, allow_processes: bool
) -> list[GpuCheck]:
    """Each wanted GPU against the thresholds; a GPU nvidia-smi does not list is a problem."""
    by_index = {g.index: g for g in gpus}
    findings: list[GpuCheck] = []
    for index in wanted:
        gpu = by_index.get(index)
        if gpu is None:
            findings.append(GpuCheck(index, None, None, 0, (f"GPU {index} not found (nvidia-smi lists {sorted(by_index)})",)))
            continue
        problems: list[str] = []
        if gpu.memory_used_mib > max_memory_mib:
            problems.append(f"{gpu.memory_used_mib} MiB used > {max_memory_mib} MiB")
        if gpu.utilization_pct is not None and gpu.utilization_pct > max_util_pct:
            problems.append(f"utilisation {gpu.utilization_pct}% > {max_util_pct}%")
        if gpu.processes and not allow_processes:
            problems.append(f"{len(gpu.processes)} compute process(es) running")
        findings.append(GpuCheck(index, gpu.memory_used_mib, gpu.utilization_pct, len(gpu.processes), tuple(problems)))
    return findings
