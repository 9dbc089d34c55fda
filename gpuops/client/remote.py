"""Run a shipped target tool through any transport: when the target lacks gpuops' files, copy them, run again."""

from __future__ import annotations

from typing import Callable, TypeVar

from gpuops.command import Cmd
from gpuops.client.ship import bundle, check_installed, install, needs_lib, with_install
from gpuops.transport.base import Result, Transport

T = TypeVar("T")


def run_tool(transport: Transport, cmd: Cmd, *, timeout: float, label: str, stdin: bytes | None = None,
             mask: Callable[[str], str] | None = None) -> Result:
    """`cmd` on the target; its result once the files are there."""
    result, _ = _shipped(transport, lambda: (transport.run(cmd, timeout=timeout, stdin=stdin), None),
                         timeout=timeout, label=label, mask=mask)
    return result


def run_tool_with_state(transport: Transport, cmd: Cmd, *, timeout: float, label: str) -> tuple[Result, str | None]:
    """`cmd` (a tool that reads no stdin) on the target and the container's state, in one round trip
    (Transport.run_with_state); where gpuops' files are missing, copied and run again in one more."""
    got = transport.run_with_state(cmd, timeout=timeout)
    if needs_lib(got[0].exit_code, got[0].out):
        got = transport.run_with_state(with_install(cmd), timeout=max(timeout, 60.0), stdin=bundle().zip)
        check_installed(got[0], label=label, after=True)
    return got


def _shipped(transport: Transport, attempt: Callable[[], tuple[Result, T]], *, timeout: float, label: str,
             mask: Callable[[str], str] | None = None) -> tuple[Result, T]:
    """One attempt; when it says the shipped copy is missing, install it and try once more."""
    got = attempt()
    if needs_lib(got[0].exit_code, got[0].out):
        install(transport, timeout=max(timeout, 60.0), label=label, mask=mask)
        got = attempt()
    return got
