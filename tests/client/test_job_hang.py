"""Where a torchrun job hung, on the bench (CT 200 and CT 201 behind the real sshd, real tmux, the torchrun stand-in
and the stand-in torch, which has no Flight Recorder): one rank goes elsewhere and never joins an all_reduce, the
job stalls with nobody attached, every node's stacks are taken before its abort and the verdict names the rank,
its node, the call the others wait in and where the rank was; a playbook's own recorder buffer is kept; a node
whose throughput sits below the other's is warned about by name; live stacks come from every node.
The same with real torch and gloo, and the Flight Recorder, is tests/client/test_job_hang_real_torch.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from bench import FakeProxmox, SshServer
from bench.waiting import wait_until
from test_nodes_bench import STANDINS, Job, end_job, make_job

#: The trainer each node's torchrun starts: all_reduce every step through the stand-in torch's store; with
#: SKIP_AT, rank 1 goes elsewhere (load_batch, asleep) at that step and never makes its all_reduce.
HANG_WORKER = '''import os, sys, time
import torch.distributed as dist


def load_batch():
    time.sleep(3600)  # elsewhere: a data loader that never returns


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print("rank %d buffer %s timeout %s" % (rank, os.environ.get("TORCH_FR_BUFFER_SIZE"),
                                            os.environ.get("GPUOPS_COLLECTIVE_TIMEOUT")), flush=True)
    skip = int(os.environ.get("SKIP_AT") or 0)
    rate = os.environ.get("RATE", "1000")
    for step in range(1, 100000):
        if rank == 1 and step == skip:
            print("rank 1 goes elsewhere", flush=True)
            load_batch()
        dist.all_reduce(1.0)
        print("step %d tok/s %s" % (step, rate), flush=True)
        time.sleep(0.1)


main()
'''


@pytest.fixture
def job(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Iterator[Job]:
    j = make_job(sshd, fake_proxmox, tmp_path)
    j.worker.write_text(HANG_WORKER)
    yield j
    end_job(j)


def write(job: Job, notify_to: Path | None = None, **extra: Any) -> None:
    job.write(**extra)
    data = yaml.safe_load(job.playbook.read_text())
    data["launch"]["command"] = f"{job.worker}"
    if notify_to is not None:
        data["notify"] = [{"on": ["aborted"], "command": f'cat "$GPUOPS_NOTIFY_JSON" >> {notify_to}'}]
    job.playbook.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_rank_that_never_joins_a_collective_stalls_the_job_and_every_node_says_where_it_hung(
        job: Job, fake_proxmox: FakeProxmox, tmp_path: Path) -> None:
    for vmid in (200, 201):
        fake_proxmox.set_env(vmid, SKIP_AT="6")
    sent = tmp_path / "notified.jsonl"
    write(job, sent, watch={"stall_timeout": 3}, env={"PYTHONPATH": str(STANDINS), "TORCH_FR_BUFFER_SIZE": "64"})
    assert job.gpuops("launch", "--detach", "--yes").code == 0
    wait_until(lambda: all((job.run_dir(v) / "abort-done.json").exists() for v in (200, 201)), timeout=90,
               message="both nodes stopped")
    # Stopped for a stall on every node: its own stall, or the job's (the other node's stall came first).
    for vmid in (200, 201):
        rec = job.record(vmid, "abort.json")
        assert rec["reason"] == "stall" or (rec["reason"] == "job" and rec["first_reason"] == "stall"), rec
    # The playbook's own recorder buffer reached the ranks as it was set; the collective timeout is the job's.
    assert "rank 0 buffer 64 timeout 63" in job.text(200, "log") and "rank 1 buffer 64 timeout 63" in job.text(201, "log")
    # Every node's stacks before its abort, each rank's labelled; the same verdict on both nodes.
    done = {vmid: job.record(vmid, "abort-done.json") for vmid in (200, 201)}
    for vmid, rank in ((200, 0), (201, 1)):
        rows = [r for r in done[vmid]["stacks"] if r.get("rank") == rank]
        assert rows and rows[0]["file"] and (job.run_dir(vmid) / rows[0]["file"]).exists(), done[vmid]["stacks"]
    verdict = done[200]["hang"]
    assert verdict == done[201]["hang"], (verdict, done[201]["hang"])
    assert verdict["source"] == "stacks" and verdict["collective"]["op"] == "all_reduce", verdict
    assert verdict["waiting"] == [{"rank": 0, "node": "ct200"}], verdict
    assert [(m["rank"], m["node"]) for m in verdict["missing"]] == [(1, "ct201")] and verdict["culprit_node"] == "ct201"
    assert "worker.py" in verdict["missing"][0]["where"] and "load_batch" in verdict["missing"][0]["where"], verdict
    assert any("no Flight Recorder" in n for n in verdict["notes"]), verdict["notes"]
    said = ("rank 0 on ct200 waits in all_reduce (from their stacks: no Flight Recorder); rank 1 on ct201 never "
            "arrived: it was at worker.py:")
    assert verdict["text"].startswith(said), verdict["text"]
    # logs --stacks: every node's stacks, per node and rank, and where the job hung.
    stacks = job.gpuops("logs", "--stacks")
    assert stacks.code == 0, stacks
    out = stacks.out.decode()
    assert "[ct200] pid" in out and "(rank 0)" in out and "[ct201] pid" in out and "(rank 1)" in out, out
    assert "in load_batch" in out and said in stacks.err, stacks
    # The job's summary: the first failing node is the rank's that never arrived, the code a stall's.
    follow = job.gpuops("logs", "-f", "--json")
    last = follow.events()[-1]
    assert follow.code == 8 and last["event"] == "summary" and last["first_failing_node"] == "ct201", last
    assert last["hang"]["culprit_node"] == "ct201" and said in last["message"], last
    # status, runs and the report say it too.
    assert f"the job hung: {said}" in job.gpuops("status").text
    runs = job.gpuops("runs", "--json").events()
    assert {r["target"]: r["job"]["ended_by_node"] for r in runs} == {"ct200": "ct201", "ct201": "ct201"}, runs
    assert all(said in r["job"]["hang"]["text"] for r in runs)
    page = job.playbook.with_name("report.html")
    assert job.gpuops("report", "-o", str(page)).code == 0
    assert "where the job hung" in page.read_text() and "load_batch" in page.read_text()
    # The notification, sent by each node's watchdog once its abort had the verdict.
    wait_until(lambda: sent.exists() and len(sent.read_text().splitlines()) >= 2, timeout=30,
               message="both nodes' aborted notifications")
    payloads = [json.loads(x) for x in sent.read_text().splitlines()]
    assert {p["target"] for p in payloads} == {"ct200", "ct201"}
    for payload in payloads:
        assert payload["outcome"] == "stalled" and payload["exit_code"] == 8, payload
        assert payload["hang"]["culprit_node"] == "ct201" and said in payload["text"], payload


def test_a_slow_node_is_warned_about_by_name_and_live_stacks_come_from_every_node(
        job: Job, fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.set_env(201, RATE="300")  # node 1's own figure: a throttled GPU
    write(job, watch={"stall_timeout": 0, "sample_interval": 1, "slow_node": {"settle": 1, "window": 3},
                      "throughput": {"pattern": r"tok/s (\d+)", "settle": 1, "window": 3}})
    assert job.gpuops("launch", "--detach", "--yes").code == 0

    def slow(vmid: int) -> list[dict[str, Any]]:
        events = [json.loads(x) for x in job.text(vmid, "events.jsonl").splitlines()]
        return [e for e in events if e["event"] == "match" and e.get("rule") == "slow-node"]

    wait_until(lambda: slow(201), timeout=60, message="node 1 warned about as slow")
    (warned,) = slow(201)
    assert warned["action"] == "warn" and warned["figures"]["node"] == "ct201", warned
    assert warned["message"].startswith("node ct201's throughput 300/s") and "ct200 1,000/s" in warned["message"], warned
    assert not slow(200), "the fast node warned about itself"
    assert "rank 0 buffer 2000 " in job.text(200, "log")  # gpuops' default buffer where the env sets none
    live = job.gpuops("stacks", "--json")  # every node's stacks, now, the job going on
    assert live.code == 0, live
    ranks = {(e["target"], e.get("rank")) for e in live.events() if e["event"] == "stacks" and e.get("file")}
    assert {("ct200", 0), ("ct201", 1)} <= ranks, ranks
    assert job.alive(200) and job.alive(201)
