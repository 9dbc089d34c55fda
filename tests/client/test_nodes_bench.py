"""One torchrun job over CT 200 (node 0) and CT 201 (node 1) behind the real sshd, with real tmux, the torchrun
stand-in and the stand-in torch's TCPStore: ranks, one run id, one node's fatal line ending both nodes with
nobody attached (the job's cause on each), a restart of both together on a fresh rendezvous, and preflight
on every node before anything starts."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from bench import BENCH_PATH, FakeProxmox, SshServer, write_inventory
from bench.cli import gpuops
from bench.waiting import wait_until

from gpuops.agent.wire import jobwire

SESSION = "job"
STANDINS = Path(__file__).resolve().parents[1] / "standins"
WORKER = '''import os, sys, time
mode = os.environ.get("MODE", "steps")
print("rank %s of %s group %s rdzv %s restart %s" % (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["GROUP_RANK"],
      os.environ["TORCHELASTIC_RUN_ID"], os.environ["TORCHELASTIC_RESTART_COUNT"]), flush=True)
if os.environ.get("TORCHELASTIC_RUN_ID", "").endswith("-a2"):
    mode = "steps"  # the restarted attempt trains to the end on every node
    while os.environ.get("HOLD") and not os.path.exists(os.environ["HOLD"]):
        print("held", flush=True)  # ... once the test lets it (HOLD)
        time.sleep(0.1)
steps = sys.argv[1] if mode == "steps" else "3"  # the FX modes: a few steps, then the race (once GO exists, if set)
go = ["--go", os.environ["GO"]] if os.environ.get("GO") and mode != "steps" else []
os.execvp("fake-train", ["fake-train", "--mode", mode, "--gpus", "0", "--interval", "0.1", "--steps", steps,
          "--slow-interval", "0.2"] + go)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, fake: FakeProxmox, inventory: Path, playbook: Path, worker: Path) -> None:
        self.fake, self.inventory, self.playbook, self.worker = fake, inventory, playbook, worker
        self.figures: dict[str, float] = {}  # what a test measured on its way, for the fault matrix to print

    def write(self, steps: int = 2000, **extra: Any) -> None:
        command = f"{shlex.quote(str(self.worker))} {steps}"  # a folder with a space (the fault matrix's) too
        data = {"name": "job-test", "env": {"PYTHONPATH": str(STANDINS)}, "preflight": {"gpus": [0]},
                "launch": {"session": SESSION, "command": command, "nodes": ["ct200", "ct201"],
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

    def text(self, vmid: int, name: str) -> str:
        """A record's text; '' while it is not there (between attempts the log is filed away, then made again)."""
        try:
            return (self.run_dir(vmid) / name).read_text()
        except FileNotFoundError:
            return ""

    def link_said(self, vmid: int, state: str) -> list[dict[str, Any]]:
        """The node's `job_link` events of that state (connected, forged, gone, lost)."""
        events = [json.loads(x) for x in self.text(vmid, "events.jsonl").splitlines()]
        return [e for e in events if e["event"] == "job_link" and e.get("state") == state]

    def store(self) -> Any:
        """A plain client of the job's rendezvous store on node 0, as any process that reaches its port has."""
        spec = importlib.util.spec_from_file_location("standin_store", STANDINS / "torch" / "distributed" / "_store.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        port = yaml.safe_load(self.playbook.read_text())["launch"]["torchrun"]["port"]
        return module.Client("127.0.0.1", port, 30)


def link_cpu(fake: FakeProxmox, vmid: int) -> float:
    """CPU seconds the node's job link process has used so far (/proc; it is no child of ours)."""
    for pid in fake.processes(vmid):
        try:
            if b"job-store" in Path(f"/proc/{pid}/cmdline").read_bytes():
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    raise AssertionError(f"no job link in CT {vmid}")


def make_job(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Job:
    """The job over CT 200 and CT 201 (made here) on the bench's sshd (also the fault matrix's, issue 35)."""
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
    return j


def end_job(j: Job) -> None:
    """Stop what a test left running."""
    for vmid in (200, 201):
        if j.alive(vmid):
            j.gpuops("stop")


@pytest.fixture
def job(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Iterator[Job]:
    j = make_job(sshd, fake_proxmox, tmp_path)
    yield j
    end_job(j)


def test_one_nodes_fatal_line_ends_the_job_on_every_node_with_nobody_attached(job: Job) -> None:
    started = job.gpuops("launch", "--detach", "--yes", "--json")
    assert started.code == 0, started
    run = started.events()[-1]["run"]
    assert job.run_dir(200).name == job.run_dir(201).name == run  # one run id on every node
    wait_until(lambda: not job.alive(200) and not job.alive(201), timeout=60, message="both nodes' sessions gone")
    log0, log1 = (job.run_dir(v) / "log" for v in (200, 201))
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


def test_a_forged_end_in_the_store_blocks_nothing_costs_one_event_and_the_job_ends_by_its_first_failing_node(
        job: Job, fake_proxmox: FakeProxmox, tmp_path: Path) -> None:
    go = tmp_path / "go"
    fake_proxmox.set_env(201, GO=str(go))  # node 1 hits the FX race once the test says so
    started = job.gpuops("launch", "--detach", "--yes")
    assert started.code == 0, started
    run = job.run_dir(200).name
    wait_until(lambda: job.link_said(200, "connected") and job.link_said(201, "connected"), timeout=60,
               message="both nodes' links connected")
    # Anyone who reaches node 0's store writes an unsigned end under the job's end key before any node ended.
    job.store().call(op="set", key=f"gpuops/job/{run}/end", value=json.dumps({"node": "ct200", "reason": "match"}))
    wait_until(lambda: job.link_said(200, "forged") and job.link_said(201, "forged"), message="the value refused")
    cpu = [link_cpu(fake_proxmox, v) for v in (200, 201)]
    log0 = job.run_dir(200) / "log"
    steps = log0.read_text().count("\nstep ")
    wait_until(lambda: log0.read_text().count("\nstep ") >= steps + 20, timeout=60, message="20 more steps on node 0")
    used = [link_cpu(fake_proxmox, v) - c for v, c in zip((200, 201), cpu, strict=True)]
    job.figures["link CPU s"] = max(used)
    assert max(used) < 0.1, f"a job link spent {used} CPU seconds over 20 steps with the forged value there"
    assert [len(job.link_said(v, "forged")) for v in (200, 201)] == [1, 1]  # said once, then ignored
    go.touch()
    wait_until(lambda: not job.alive(200) and not job.alive(201), timeout=60, message="both nodes' sessions gone")
    theirs = job.record(200, "abort.json")  # node 1's real end reached node 0 through the store
    assert theirs["reason"] == "job" and theirs["first_node"] == "ct201" and theirs["rule"] == "fx-tracing-race", theirs
    assert [len(job.link_said(v, "forged")) for v in (200, 201)] == [1, 1]
    follow = job.gpuops("logs", "-f", "--json")  # node 0 ended by the job carries node 1's code, not a failure's
    codes = {e["target"]: e["exit_code"] for e in follow.events() if e["event"] == "summary"}
    assert follow.code == 7 and codes == {"ct200": 7, "ct201": 7}, follow


def test_node_0_killed_before_the_others_joined_ends_every_node_within_30s(
        job: Job, fake_proxmox: FakeProxmox, tmp_path: Path) -> None:
    # Node 1's torchrun is slow to start (importing torch, say): it has not joined when node 0 dies, so torchrun
    # would wait out its 600 s join timeout; node 1's job link holds node 0's store and sees it go.
    late = tmp_path / "late"
    late.mkdir()
    shim = late / "torchrun"
    shim.write_text("#!/bin/sh\nexec sleep 600\n")  # still starting: it joins no rendezvous while the test looks
    shim.chmod(0o755)
    fake_proxmox.set_env(201, PATH=f"{late}:{BENCH_PATH}")
    started = job.gpuops("launch", "--detach", "--yes")
    assert started.code == 0, started
    wait_until(lambda: job.link_said(201, "connected"), timeout=60, message="node 1's link connected to node 0's store")
    fake_proxmox.stop_container(200)  # node 0 killed: its torchrun (the store), its watchdog, everything
    killed = time.monotonic()
    wait_until(lambda: not job.alive(201), timeout=30, message="node 1 ended within 30 s of node 0's death")
    job.figures["node 1 ended after s"] = time.monotonic() - killed
    theirs = job.record(201, "abort.json")
    assert theirs["reason"] == "job" and theirs["first_node"] == "ct200" and theirs["first_by"] == "store-gone", theirs
    assert job.link_said(201, "gone"), "node 1 said why it stopped"


def test_a_restart_restarts_every_node_together_on_a_fresh_rendezvous_no_old_end_ends(
        job: Job, fake_proxmox: FakeProxmox, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    for vmid in (200, 201):
        fake_proxmox.set_env(vmid, HOLD=str(hold))  # attempt 2 trains once the test has replayed attempt 1's end
    job.write(steps=15, restart={"max": 1, "on": ["fx-tracing-race"], "delay": 1})
    started = job.gpuops("launch", "--detach", "--yes")
    assert started.code == 0, started
    run = job.run_dir(200).name
    wait_until(lambda: all(f"rdzv {run}-a2 " in job.text(v, "log") for v in (200, 201)), timeout=90,
               message="attempt 2 on both nodes")
    # Attempt 1's end, signed with the run's key, as node 1 wrote it into attempt 1's key, copied into attempt 2's.
    first = json.loads((job.run_dir(200) / "attempts" / "1" / "job-end.json").read_text())
    key = json.loads((job.run_dir(200) / "watch.json").read_text())["job"]["key"]
    job.store().call(op="set", key=f"gpuops/job/{run}-a2/end", value=jobwire.sign(key, first))

    def aborted() -> bool:
        return any((job.run_dir(v) / "abort.json").exists() for v in (200, 201))

    wait_until(lambda: aborted() or (job.link_said(200, "forged") and job.link_said(201, "forged")), timeout=30,
               message="the replayed end refused, or acted on")
    assert not aborted(), "attempt 1's end ended attempt 2"
    assert "replayed" in job.link_said(200, "forged")[0]["message"]
    hold.touch()

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
