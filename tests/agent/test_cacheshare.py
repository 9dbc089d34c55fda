"""Which other runs may write to a run's inductor cache (agent/cacheshare.py), seen on real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from bench import wait_until

from gpuops.agent.detect.cacheshare import CacheSharing


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    folder = tmp_path / "runs"
    (folder / "20261201-100000-aaaaaa").mkdir(parents=True)
    return folder


def sleeper(env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={"PATH": os.environ["PATH"], **env})
    wait_until(lambda: b"GPUOPS_RUN_ID" in Path(f"/proc/{proc.pid}/environ").read_bytes() or None, timeout=10,
               message="the process's environment")
    return proc


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_live_process_of_another_run_with_this_cache_shares_it(runs: Path, tmp_path: Path,
                                                                  procs: list[subprocess.Popen]) -> None:
    cache = tmp_path / "cache"
    share = CacheSharing(str(runs), "20261201-100000-aaaaaa", str(cache), {"USER": "root"})
    since = time.time() + 3600  # no run directory counts: only the processes
    procs.append(sleeper({"GPUOPS_RUN_ID": "20261201-100000-aaaaaa", "TORCHINDUCTOR_CACHE_DIR": str(cache)}))  # our own
    procs.append(sleeper({"GPUOPS_RUN_ID": "20261201-100500-cccccc", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "x")}))
    assert share.others(since) == []  # this run's own process, and another run with another cache
    procs.append(sleeper({"GPUOPS_RUN_ID": "20261201-100100-bbbbbb", "TORCHINDUCTOR_CACHE_DIR": str(cache)}))
    assert share.others(since) == ["20261201-100100-bbbbbb"]
    procs[-1].kill()
    procs[-1].wait()
    assert share.others(since) == []


def test_another_run_active_since_the_last_look_with_this_cache_in_its_env_shares_it(runs: Path, tmp_path: Path) -> None:
    default = "/tmp/torchinductor_root"
    # no processes here (this machine's /proc holds other tests' runs on the default cache)
    share = CacheSharing(str(runs), "20261201-100000-aaaaaa", default, {"USER": "root"}, proc=str(tmp_path / "proc"))
    other = runs / "20261201-100100-bbbbbb"
    other.mkdir()
    (other / "watch.json").write_text(json.dumps({"env": {"PYTHONUNBUFFERED": "1"}}))  # the default cache
    moved = runs / "20261201-100200-cccccc"
    moved.mkdir()
    (moved / "watch.json").write_text(json.dumps({"env": {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "own")}}))
    assert share.others(time.time() - 5) == ["20261201-100100-bbbbbb"]
    old = time.time() - 600
    os.utime(other, (old, old))
    assert share.others(time.time() - 5) == []  # it ended long before the last look
