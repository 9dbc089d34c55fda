"""The reap finds every process of a run (issue 19, item 10): a worker started with `setsid env -i`
(no run marker) as a child, or double-forked away so that init is its parent, holding 20 GB on a GPU
of the run. After the abort no process of the run is left and the GPUs drain; where a GPU does not,
the abort says which pids hold it."""

from __future__ import annotations

import json

import pytest
from bench import procs, wait_until
from bench.watchdog import wait_watching
from test_watch import Ct
from test_watchdog import go_file

ESCAPE = 'env -i PATH="$PATH" GPUOPS_FAKE_GPUS="$GPUOPS_FAKE_GPUS" fake-train --mode hold --gpus 6 --mib 20000'


def holders(ct: Ct) -> list[int]:
    """Live processes that registered fake GPU memory in this container (whatever their environment)."""
    folder = ct.fake.gpu_dir(200) / "procs"
    found = []
    for entry in folder.glob("*.json") if folder.exists() else []:
        pid = int(entry.stem) if entry.stem.isdigit() else None
        if pid and procs.is_alive(pid):
            found.append(pid)
    return found


@pytest.mark.parametrize("how", ["child", "double-fork"])
def test_a_worker_without_the_run_marker_is_reaped_and_the_gpus_drain(ct: Ct, how: str) -> None:
    go, opt = go_file(ct)
    spawn = f"setsid {ESCAPE} </dev/null >/dev/null 2>&1 &" if how == "child" else \
        f"( setsid {ESCAPE} </dev/null >/dev/null 2>&1 & ); "
    job = f"{spawn} fake-train --mode fx-thread --gpus 5 --interval 0.05 {opt}"
    ct.launch_detached(job)
    wait_watching(ct.run_dir())
    wait_until(lambda: ct.fake.gpus(200).memory_used(6) > 20000 and ct.fake.gpus(200).memory_used(5) > 0, timeout=60,
               message="the trainer and its escaped worker to hold their GPUs")
    escaped = [pid for pid in holders(ct) if pid not in ct.run_processes()]
    assert escaped, "the worker carries no marker"
    go.touch()
    done_path = ct.run_dir() / "abort-done.json"
    wait_until(done_path.exists, timeout=90, message="the abort to finish")
    done = json.loads(done_path.read_text())
    assert done["survivors"] == [] and "held_by" not in done, done
    assert [g["memory_used_mib"] for g in done["gpus"]] == [0, 0], done
    assert not any(procs.is_alive(pid) for pid in escaped)


def test_a_gpu_that_does_not_drain_is_said_with_its_holders(ct: Ct) -> None:
    # Another user's job takes GPU 6 meanwhile (from its own shell: not the run's, so not killed): named.
    ct.launch_detached("fake-train --mode steps --steps 100000 --gpus 5 --interval 0.05")
    wait_watching(ct.run_dir())
    other = ct.fake.occupy_gpu(200, 6, mib=20000)
    result = ct.gpuops("stop")
    assert f"GPU 6 DID NOT DRAIN (held by pids [{other}])" in result.err, result
    done = json.loads((ct.run_dir() / "abort-done.json").read_text())
    assert done["held_by"] == {"6": [other]}, done
    assert procs.is_alive(other)
