"""Where a torchrun job hung, with REAL torchrun, real torch and gloo on the CPU, through gpuops' real path (the
bench's sshd and pct stand-in, CT 200 and CT 201): rank 1 never joins its 6th all_reduce; nobody is attached;
both nodes are stopped for the stall, each rank's Flight Recorder is dumped by gpuops' helper thread in the
training's own torch, the nodes exchange their summaries through torchrun's own store, and every node's verdict
names the collective, the rank that never arrived, its node and where it was. The training passes no timeout to
init_process_group: the job's collective timeout reaches the process group through gpuops' sitecustomize.
Skipped where no real torch can be had (tests/bench/realtorch.py says where it looks)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import yaml
from bench import FakeProxmox, SshServer
from bench.realtorch import SKIP_REASON, container_path, torch_python
from bench.waiting import wait_until
from test_nodes_bench import Job, end_job, make_job

pytestmark = pytest.mark.skipif(torch_python() is None, reason=SKIP_REASON)

TRAIN = '''import os, time
print("starting", flush=True)
import torch
import torch.distributed as dist


def load_batch():
    time.sleep(3600)  # elsewhere: a data loader that never returns


def main():
    dist.init_process_group("gloo")  # no timeout of its own: the job's comes through gpuops
    rank = dist.get_rank()
    x = torch.ones(4)
    for step in range(1, 1000):
        if rank == 1 and step == 6:
            print("rank 1 goes elsewhere", flush=True)
            load_batch()
        dist.all_reduce(x)
        print("rank %d step %d" % (rank, step), flush=True)
        time.sleep(0.2)


main()
'''
STALL = 20  # seconds: more than real torchrun's silent start (imports, rendezvous) on a loaded two-core machine


@pytest.fixture
def job(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Iterator[Job]:
    j = make_job(sshd, fake_proxmox, tmp_path)
    path = container_path(tmp_path / "torch-bin")
    for vmid in (200, 201):
        fake_proxmox.set_env(vmid, PATH=path)
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    j.write()
    data = yaml.safe_load(j.playbook.read_text())
    data["env"] = {}
    data["launch"]["command"] = str(train)
    data["watch"] = {"stall_timeout": STALL}
    j.playbook.write_text(yaml.safe_dump(data, sort_keys=False))
    yield j
    end_job(j)


def test_real_torchrun_gloo_a_rank_that_skips_an_all_reduce_is_named_with_its_node_collective_and_where(job: Job) -> None:
    assert job.gpuops("launch", "--detach", "--yes").code == 0
    wait_until(lambda: all((job.run_dir(v) / "abort-done.json").exists() for v in (200, 201)), timeout=240,
               message="both nodes stopped for the stall")
    for vmid in (200, 201):
        rec = job.record(vmid, "abort.json")
        assert rec["reason"] == "stall" or (rec["reason"] == "job" and rec["first_reason"] == "stall"), rec
    verdicts = [job.record(v, "abort-done.json")["hang"] for v in (200, 201)]
    verdict = verdicts[0]
    assert verdicts[1] == verdict, verdicts
    assert verdict["source"] == "flight-recorder", verdict
    collective = verdict["collective"]
    assert (collective["op"], collective["seq"], collective["pg"], collective["backend"]) == ("all_reduce", 6, "0", "gloo")
    assert collective["timeout_ms"] == (STALL + 60) * 1000, collective  # the job's timeout, set by gpuops' sitecustomize
    assert verdict["waiting"] == [{"rank": 0, "node": "ct200"}], verdict
    (missing,) = verdict["missing"]
    assert (missing["rank"], missing["node"], missing["last"]) == (1, "ct201", 5), verdict
    assert missing["where"].startswith("train.py:") and "in load_batch" in missing["where"], missing
    assert verdict["culprit_node"] == "ct201" and verdict["notes"] == [], verdict
    assert verdict["text"].startswith("rank 0 on ct200 waits in all_reduce #6 of process group 0 (default_pg); rank 1 "
                                      "on ct201 never arrived (its last: #5): it was at train.py:"), verdict["text"]
    follow = job.gpuops("logs", "-f", "--json")  # the job's code and first failing node: the rank that never came
    last = follow.events()[-1]
    assert follow.code == 8 and last["first_failing_node"] == "ct201" and last["hang"] == verdict, last
