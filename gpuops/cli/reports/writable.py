"""Where a report is written (--junit, --report, `gpuops report -o`): a path checked before anything runs."""

from __future__ import annotations

import os

from gpuops.errors import UsageError


def check_writable(path: str, flag: str) -> None:
    """Refuse a report path that cannot be written before anything runs, not after a two-hour run."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a directory, expected a file path")
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path}: cannot write there (permission denied)")
