"""The job's collective timeout as the process group's default, in each rank, without a change to the training.

`torchrun.collective_timeout` reaches a rank as GPUOPS_COLLECTIVE_TIMEOUT (seconds). A training that passes
``init_process_group(timeout=...)`` keeps its own; one that passes none gets torch's default, which
``torch.distributed.distributed_c10d._get_default_timeout`` reads from the module's globals at the call:
``default_pg_timeout`` (gloo and the others: 30 minutes in torch 2.13) and ``default_pg_nccl_timeout`` (10
minutes). Once torch is imported (guard/importhook.after_torch: torch imports distributed_c10d itself), those
globals are set to the job's timeout; nothing else of torch is touched. Loaded by pythonpath/sitecustomize.py in
a rank (RANK set) whose environment has the variable. Never imports torch itself.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

VAR = "GPUOPS_COLLECTIVE_TIMEOUT"
#: The modules that hold the default (distributed_c10d reads its own; the others re-export it for readers).
_HOLDERS = ("torch.distributed.distributed_c10d", "torch.distributed.constants")


def seconds() -> Optional[float]:
    try:
        value = float(os.environ.get(VAR) or "")
    except ValueError:
        return None
    return value if value > 0 else None


def apply(torch: Any) -> None:
    """Set the process group's default timeouts to the job's (only where torch has them)."""
    value = seconds()
    if value is None:
        return
    from datetime import timedelta

    timeout = timedelta(seconds=value)
    for name in _HOLDERS:
        module: Any = sys.modules.get(name)  # torch's: no types for it here
        if module is None:
            continue
        if hasattr(module, "default_pg_timeout"):
            module.default_pg_timeout = timeout
        if getattr(module, "default_pg_nccl_timeout", None) is not None:
            module.default_pg_nccl_timeout = timeout


def install() -> bool:
    """Apply once torch is imported, in a rank that has the variable; True if it will."""
    if "RANK" not in os.environ or seconds() is None:
        return False
    from .importhook import after_torch

    after_torch(apply)
    return True
