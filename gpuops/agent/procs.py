"""Processes on the target, as /proc shows them."""

from __future__ import annotations


def running(pid: int) -> bool:
    """The process exists and is no zombie (a killed process whose parent never reaped it)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            text = fh.read(4096)
    except OSError:
        return False
    return text.rsplit(b")", 1)[-1].split()[:1] != [b"Z"]
