"""`gpuops stop` while a launch is still warming up: the warmup dies and training never starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import jsoncheck
from bench.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _gpuops(*args: str, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPS_") or k.startswith("GPUOPS_FAKE")}
    return subprocess.Popen([sys.executable, "-m", "gpuops", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT, **kw)


def test_stop_during_warmup_ends_the_launch_before_training(local_env, tmp_path: Path) -> None:
    marker = tmp_path / "trained"
    pb = tmp_path / "pb.yaml"
    pb.write_text(
        "name: w\ntarget: local\n"
        f"workdir: {ROOT / 'playbooks'}\n"
        "warmup: {gpus: [0, 1, 2], command: 'python3 demo_trainer.py warmup --gpu {gpu} --steps 40 --interval 0.25'}\n"
        f"launch: {{session: wtest, command: 'touch {marker}; python3 demo_trainer.py train'}}\n"
    )
    inv = str(ROOT / "inventories" / "local.yaml")
    launcher = _gpuops("launch", "--json", "-i", inv, "-p", str(pb))
    runs = Path(local_env.home) / ".gpuops" / "runs"
    wait_until(lambda: any(runs.glob("*/warmup-0.log")), timeout=60, message="the warmup on GPU 0 to start")

    stopper = _gpuops("stop", "-i", inv, "-p", str(pb))
    out, err = stopper.communicate(timeout=120)
    assert stopper.returncode == 0, err
    assert "stopped during its warmup" in err

    out, err = launcher.communicate(timeout=120)
    jsoncheck.check(launcher.args, out)  # every --json line valid against `gpuops schema`
    summary = json.loads(out.strip().splitlines()[-1])
    assert launcher.returncode == 6
    assert summary["outcome"] == "stopped" and "training not started" in summary["message"]
    assert not marker.exists(), "training started after gpuops stop"
    assert not any(runs.glob("*/warmup-1.log")), "the next GPU's warmup started after gpuops stop"
    (run,) = list(runs.iterdir())
    assert json.loads((run / "abort.json").read_text())["reason"] == "stop"
    marker_env = f"GPUOPS_RUN_ID={run.name}".encode()
    assert [p for p in _environs() if marker_env in p[1].split(b"\0")] == []


def _environs() -> list[tuple[str, bytes]]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry.name, (entry / "environ").read_bytes()))
            except OSError:
                pass
    return out
