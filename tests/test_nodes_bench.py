"""One torchrun job over CT 200 (node 0) and CT 201 (node 1) behind the real sshd, with real tmux, the torchrun
stand-in and the stand-in torch's TCPStore: ranks, one run id, one node's fatal line ending both nodes with
nobody attached (the job's cause on each), a restart of both together on a fresh rendezvous, and preflight
on every node before anything starts."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from bench import FakeProxmox, SshServer, write_inventory
from bench.cli import gpuops
from bench.waiting import wait_until

SESSION = "job"
STANDINS = Path(__file__).resolve().parent / "standins"
WORKER = '''import os, sys
mode = os.environ.get("MODE", "steps")
if os.environ.get("TORCHELASTIC_RUN_ID", "").endswith("-a2"):
    mode = "steps"  # the restarted attempt trains to the end on every node
print("rank %s of %s group %s rdzv %s restart %s" % (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["GROUP_RANK"],
      os.environ["TORCHELASTIC_RUN_ID"], os.environ["TORCHELASTIC_RESTART_COUNT"]), flush=True)
steps = sys.argv[1] if mode == "steps" else "3"  # the FX modes: a few steps, then the race
os.execvp("fake-train", ["fake-train", "--mode", mode, "--gpus", "0", "--interval", "0.1", "--steps", steps,
          "--slow-interval", "0.2"])
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, fake: FakeProxmox, inventory: Path, playbook: Path, worker: Path) -> None:
        self.fake, self.inventory, self.playbook, self.worker = fake, inventory, playbook, worker

    def write(self, steps: int = 2000, **extra: Any) -> None:
        data = {"name": "job-test", "env": {"PYTHONPATH": str(STANDINS)}, "preflight": {"gpus": [0]},
                "launch": {"session": SESSION, "command": f"{self.worker} {steps}", "nodes": ["ct200", "ct201"],
                           "torchrun": {"nproc_per_node": 1, "port": free_port()}},
                "watch": {"stall_timeout": 0}, "abort": {"grace": 3}, **extra}
        self.playbook.write_text(yaml.safe_dump(data, sort_keys=False))

    def gpuops(self, command: str, *extra: str, timeout: float = 120) -> Any:
        return gpuops(command, "-i", str(self.inventory), "-p", str(self.playbook), *extra, timeout=timeout)

    def run_dir(self, vmid: int) -> Path:
        run = (self.fake.home(vmid) / ".gpuops" / "sessions" / SESSION).read_text().strip()
        return self.fake.home(vmid) / ".gpuops" / "runs" / run

    def alive(self, vmid: int) -> bool:
        return self.fake.tmux(vmid, "has-session", "-t", f"={SESSION}").returncode == 0

    def record(self, vmid: int, name: str) -> dict[str, Any]:
        return json.loads((self.run_dir(vmid) / name).read_text())


@pytest.fixture
def job(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Iterator[Job]:
    fake_proxmox.set_env(200, MODE="steps")
    fake_proxmox.add_container(201, env={"MODE": "fx-thread"})  # node 1 hits the FX race, and lives on
    targets = {"ct201": {"host": "pve1", "ctid": 201, "gpus": list(range(8))}}
    inventory = write_inventory(tmp_path / "inventory.yaml", sshd, extra_targets=targets)
    data = yaml.safe_load(inventory.read_text())
    data["targets"]["ct200"]["rdzv_address"] = "127.0.0.1"  # the bench's containers share this machine's loopback
    inventory.write_text(yaml.safe_dump(data))
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    j = Job(fake_proxmox, inventory, tmp_path / "playbook.yaml", worker)
    j.write()
    yield j
    for vmid in (200, 201):
        if j.alive(vmid):
            j.gpuops("stop")


def test_one_nodes_fatal_line_ends_the_job_on_every_node_with_nobody_attached(job: Job) -> None:
    started = job.gpuops("launch", "--detach", "--yes", "--json")
    assert started.code == 0, started
    run = started.events()[-1]["run"]
    assert job.run_dir(200).name == job.run_dir(201).name == run  # one run id on every node
    wait_until(lambda: not job.alive(200) and not job.alive(201), timeout=60, message="both nodes' sessions gone")
    log0, log1 = (job.run_dir(v) / "log" for v in (200, 201))
    import os
    if os.environ.get("GPUOPS_MEASURE_NODES"):  # benchmarks: the fatal line to the last node's session gone
        evs = [json.loads(x) for v in (200, 201) for x in (job.run_dir(v) / "events.jsonl").read_text().splitlines()]
        line = min(e["ts"] for e in evs if e["event"] == "match")
        gone = max(e.get("session_gone_at") or e["ts"] for e in evs if e["event"] == "aborted")
        print("NODES-LATENCY", round(gone - line, 3))
    assert f"rank 0 of 2 group 0 rdzv {run} restart 0" in log0.read_text()
    assert f"rank 1 of 2 group 1 rdzv {run} restart 0" in log1.read_text()
    own = wait_until(lambda: (job.run_dir(201) / "abort.json").exists() and job.record(201, "abort.json"))
    assert own["rule"] == "fx-tracing-race" and own["by"] == "watchdog"
    theirs = job.record(200, "abort.json")
    assert theirs["reason"] == "job" and theirs["first_node"] == "ct201" and theirs["rule"] == "fx-tracing-race"
    assert job.record(200, "job-end.json")["node"] == "ct201"  # what the store said, signed by node 1
    meta = job.record(200, "meta.json")["job"]
    assert meta == {"id": run, "node_rank": 0, "nodes": ["ct200", "ct201"], "endpoint": meta["endpoint"]}
    follow = job.gpuops("logs", "-f", "--json")  # every node's log, then the job's code: node 1's
    assert follow.code == 7, follow
    assert {e["target"] for e in follow.events() if e["event"] == "log"} == {"ct200", "ct201"}
    # status, runs and the report show the job with its nodes, and node 0 as stopped by node 1's rule
    status = job.gpuops("status")
    assert f"run {run} aborted, node 0 of 2 (ct200, ct201)" in status.text, status
    assert "stopped with the job: node ct201 (rank 1) matched fx-tracing-race first" in status.text, status
    assert "node 1 of 2 (ct200, ct201)" in status.text and "stopped by the watchdog" in status.text, status
    rows = {r["target"]: r for r in job.gpuops("runs", "--json").events()}
    assert rows["ct200"]["job"] == {"id": run, "node_rank": 0, "nodes": ["ct200", "ct201"], "ended_by_node": "ct201",
                                    "ended_by_rank": 1}, rows
    assert rows["ct201"]["job"]["node_rank"] == 1 and "ended_by_node" not in rows["ct201"]["job"], rows
    assert f"{run} (node 0/2)" in job.gpuops("runs").text
    page = job.playbook.with_name("report.html")
    report = job.gpuops("report", "-o", str(page), "--json")
    assert report.code == 0 and [e["target"] for e in report.events()] == ["ct200", "ct201"], report
    html = page.read_text()
    assert "ct200: run" in html and "ct201: run" in html, "a lane per node"
    assert "node 0 of 2 (ct200, ct201) of one torchrun job" in html
    assert "the job: node ct201 (rank 1) matched fx-tracing-race first" in html


def test_a_restart_restarts_every_node_together_on_a_fresh_rendezvous(job: Job) -> None:
    job.write(steps=15, restart={"max": 1, "on": ["fx-tracing-race"], "delay": 1})
    started = job.gpuops("launch", "--detach", "--yes")
    assert started.code == 0, started
    run = job.run_dir(200).name

    def done(vmid: int) -> bool:
        beat = job.run_dir(vmid) / "watchdog.json"
        return beat.exists() and json.loads(beat.read_text()).get("state") == "done"

    wait_until(lambda: done(200) and done(201), timeout=90, message="both nodes' watchdogs done")
    for vmid, rank in ((200, 0), (201, 1)):
        log = (job.run_dir(vmid) / "log").read_text()
        assert f"rank {rank} of 2 group {rank} rdzv {run}-a2 " in log and "step 15/15" in log, log[-600:]
        assert (job.run_dir(vmid) / "exit_code").read_text().strip() == "0"
        assert (job.run_dir(vmid) / "attempts" / "1" / "abort.json").exists()  # attempt 1 ended by the job's rule
    follow = job.gpuops("logs", "-f")  # the job's code: every node succeeded on attempt 2
    assert follow.code == 0, follow


def test_one_node_failing_preflight_starts_no_node(job: Job, fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.occupy_gpu(201, 0)
    result = job.gpuops("launch", "--yes")
    assert result.code == 4 and "ct201: GPU(s) 0 not idle" in result.err, result
    assert not (fake_proxmox.home(200) / ".gpuops" / "sessions" / SESSION).exists()  # nothing made on node 0
    assert not job.alive(200) and not job.alive(201)


def test_nodes_on_one_proxmox_host_warm_up_in_turns(job: Job, fake_proxmox: FakeProxmox) -> None:
    # Both containers are on pve1 (the same machine's GPUs): node 1's warmup starts once node 0's ended.
    job.write(steps=3, warmup={"gpus": [0], "command": "fake-warmup --gpu {gpu} --duration 0.5"})
    started = job.gpuops("launch", "--detach", "--yes")
    assert started.code == 0, started

    def span(vmid: int) -> tuple[float, float]:
        times = {e: float(t) for e, _, t in (line.split() for line in fake_proxmox.warmup_log(vmid).read_text().splitlines())}
        return times["start"], times["end"]

    (s0, e0), (s1, e1) = span(200), span(201)
    assert e0 <= s1 or e1 <= s0, ((s0, e0), (s1, e1))  # one after the other, never side by side
    assert "warmup on GPU 0 done" in started.err


def test_stop_with_the_jobs_playbook_stops_every_node(job: Job, fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.set_env(201, MODE="steps")  # a healthy job: nothing ends it but the stop
    started = job.gpuops("launch", "--detach", "--yes")
    assert started.code == 0, started
    assert job.alive(200) and job.alive(201)
    stopped = job.gpuops("stop")
    assert stopped.code == 0, stopped
    assert not job.alive(200) and not job.alive(201)
    # Each node is stopped by the stop, or by its watchdog a moment before: it heard through the job's store
    # that a node the stop reached first had ended the job (first_by says who ended it).
    records = [job.record(v, "abort.json") for v in (200, 201)]
    for rec in records:
        assert rec["by"] == "stop" or (rec["reason"] == "job" and rec["first_by"] == "stop"), records
