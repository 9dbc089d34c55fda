"""A run's thread stacks, read through the agent's `stacks` tool: taken now from a live run, or as recorded."""

from __future__ import annotations

from typing import Any

from gpuops.errors import GpuopsError


def read_stacks(job: Any, run_id: str, *, recorded: bool) -> list[dict[str, Any]]:
    """One {pid, file, threads, via, text[, attempt, error]} per Python process (text masked); GpuopsError
    when the target cannot say."""
    from gpuops.agent.wire.protocol import parse_stacks
    from gpuops.client import tools

    result = job.run(tools.stacks(run_id, recorded), timeout=max(job.timeout, 30.0))
    if result.exit_code != 0:
        raise GpuopsError(f"{job.target.name}: could not read the stacks of run {run_id} (exit {result.exit_code}): "
                          f"{job.mask(result.err.strip()[-300:])}")
    return [{**row, "text": job.mask(str(row.get("text") or ""))} for row in parse_stacks(result.out)]

