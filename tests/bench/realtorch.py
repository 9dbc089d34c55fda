"""Where the tests find a real PyTorch (real torchrun, gloo on the CPU), and a container PATH that runs it.

In this order: the Python named by GPUOPS_TORCH_PYTHON; the repository's .venv-torch (made by .ci/run:
`pip install torch==2.13.0`, the CPU wheel, kept between runs); the Python running the tests. None of them
importing torch.distributed: the tests that need it skip, saying so.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from bench import BENCH_PATH, TESTS_DIR

TORCH_VENV = TESTS_DIR.parent / ".venv-torch"
SKIP_REASON = ("no real PyTorch here: set GPUOPS_TORCH_PYTHON to a Python that has torch, or run .ci/run, which "
               "makes .venv-torch (pip install torch==2.13.0, the CPU wheel)")


@functools.lru_cache(maxsize=None)
def torch_python() -> str | None:
    """A Python that imports torch.distributed, or None."""
    given = os.environ.get("GPUOPS_TORCH_PYTHON")
    for py in ([given] if given else []) + [str(TORCH_VENV / "bin" / "python"), sys.executable]:
        if not py or not Path(py).exists():
            continue
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPS_") and k != "PYTHONPATH"}
        try:
            done = subprocess.run([py, "-c", "import torch.distributed as d; assert d.is_available()"], env=env,
                                  capture_output=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return py
    return None


def container_path(folder: Path) -> str:
    """A PATH whose python3 and torchrun are the real torch's, before the bench's own (its pct and nvidia-smi
    stand-ins; the torchrun stand-in is shadowed)."""
    py = torch_python()
    assert py is not None
    folder.mkdir(parents=True, exist_ok=True)
    # Scripts, not symlinks: a venv's python found through a link in another folder does not see its pyvenv.cfg.
    for name, line in (("python3", f'exec "{py}" "$@"'), ("torchrun", f'exec "{py}" -m torch.distributed.run "$@"')):
        (folder / name).write_text(f"#!/bin/sh\n{line}\n")
        (folder / name).chmod(0o755)
    return f"{folder}:{BENCH_PATH}"
