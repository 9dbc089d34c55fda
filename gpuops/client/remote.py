"""Run a shipped target tool through any transport: when the target lacks gpuops' files, copy them, run again."""

from __future__ import annotations

from typing import Any, Callable

from gpuops.command import Cmd
from gpuops.client.ship import install, needs_lib
from gpuops.transport.base import Result


def run_tool(transport: Any, cmd: Cmd, *, timeout: float, label: str, stdin: bytes | None = None,
             via: Any = None, mask: Callable[[str], str] | None = None) -> Result:
    """`cmd` on `via` (default: the target's transport); the files go to the target's transport."""
    runner = via or transport
    result = runner.run(cmd, timeout=timeout, stdin=stdin)
    if needs_lib(result.exit_code, result.out) or (via is not None and "@@gpuops need-lib" in result.out):
        install(transport, timeout=max(timeout, 60.0), label=label, mask=mask)
        result = runner.run(cmd, timeout=timeout, stdin=stdin)
    return result
