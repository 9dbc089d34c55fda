"""The compile guard against the real PyTorch, where this machine has it (skipped otherwise): every
way a trainer compiles, three threads at once, guarded and error-free; the compiled module keeps
its type; dynamo knows the guard's frames. On a GPU machine the tensors live on cuda."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUARD_PATH = REPO / "gpuops" / "agent" / "guard" / "pythonpath"
CASES = REPO / "tests" / "agent" / "guard_cases.py"


def _env(guard: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPS_")}
    env.pop("PYTHONPATH", None)
    if guard:
        env.update(PYTHONPATH=str(GUARD_PATH), GPUOPS_COMPILE_GUARD="1")
    return env


def _has_torch() -> bool:
    done = subprocess.run([sys.executable, "-c", "import torch"], env=_env(False), capture_output=True, timeout=300)
    return done.returncode == 0


pytestmark = pytest.mark.skipif(not _has_torch(), reason="no real torch here (the lead runs this on a GPU machine)")


@pytest.mark.parametrize("case", ["functions", "options", "decorator", "module", "module_compile", "eval", "train"])
def test_real_torch_three_threads_run_guarded(case: str, tmp_path: Path) -> None:
    env = _env(True)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")  # cold caches, as in the incident
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    done = subprocess.run([sys.executable, str(CASES), case], env=env, capture_output=True, text=True, timeout=900,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "standin" not in out["torch"]
    assert out["guarded"] is True and out["errors"] == []
    assert out["counts"]["serialized"] >= 1 and out["counts"]["unguarded"] == 0


def test_real_torch_keeps_compile_signature_and_module_type() -> None:
    probe = ("import inspect, torch\n"
             "m = torch.compile(torch.nn.Linear(4, 4))\n"
             "from torch._dynamo.eval_frame import OptimizedModule\n"
             "print(isinstance(m, OptimizedModule), list(inspect.signature(torch.compile).parameters)[:2])\n")
    done = subprocess.run([sys.executable, "-c", probe], env=_env(True), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True ['model', 'fullgraph']"
