"""gpuops' torchrun job on a real GPU machine: two nodes (CT 200, node 0, and CT 201, node 1: the bench's
containers over its real sshd, each its own HOME, tmux and run directory; their processes real) running REAL
torchrun with the gloo backend (default) or NCCL on two GPUs (--nccl), the trainer tools/real_nodes_train.py.

    python3 tools/real_nodes.py OUTDIR [--nccl | --hang]

Case: launch --detach with `restart: {max: 1, on: [fx-tracing-race]}`; node 1 hits the real FX race in a
drafter thread and lives on; with nobody attached both nodes must stop (node 1 by its rule, node 0 by the
job), then both restart together on <run>-a2 and finish. OUTDIR/nodes(-nccl)/: each node's run directory
records, gpuops' JSON, and summary.json with the measured seconds from the fatal line to the last node's
session gone. Run after tools/device_setup.sh, as tools/real_h200.py is.

--hang (tools/real_hang.py): node 1's rank never joins its 6th all_reduce and the job stalls with nobody
attached; OUTDIR/nodes-hang/ holds seven files (what the device tool brings back): each node's records,
stacks and Flight Recorder dumps in one JSON, logs --stacks, logs -f --json, the notifications, the summary.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))

import yaml  # noqa: E402
from bench import FakeProxmox, SshServer, wait_until, write_inventory  # noqa: E402
from real_h200 import PY, container_path, passed_env  # noqa: E402

SESSION = "nodes"


def gpuops(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "gpuops", *args], capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    nccl = "--nccl" in argv[1:]
    hang = "--hang" in argv[1:]
    case = out / ("nodes-hang" if hang else "nodes-nccl" if nccl else "nodes")
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir(parents=True)
    work = case / "work"
    work.mkdir()
    sshd = SshServer()
    sshd.start()
    fake = FakeProxmox(sshd.fake_root)
    try:
        path = container_path(work)
        env = {**passed_env(), "PATH": path}
        for vmid, gpu in ((200, "0"), (201, "1" if nccl else "0")):
            fake.add_container(vmid)
            fake.set_env(vmid, **env, CUDA_VISIBLE_DEVICES=gpu)
        targets = {"ct201": {"host": "pve1", "ctid": 201}}
        inv = write_inventory(work / "inventory.yaml", sshd, extra_targets=targets)
        data = yaml.safe_load(inv.read_text())
        data["targets"]["ct200"]["rdzv_address"] = "127.0.0.1"
        inv.write_text(yaml.safe_dump(data))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        backend = "nccl" if nccl else "gloo"
        if hang:
            from real_hang import hang_case

            return hang_case(case, work, inv, fake, port, gpuops)
        pb = work / "playbook.yaml"
        job_env = {"NCCL_NVLS_ENABLE": "0"} if nccl else {}
        pb.write_text(yaml.safe_dump({
            "name": "real-nodes", "env": job_env,
            "launch": {"session": SESSION, "command": f"{ROOT / 'tools' / 'real_nodes_train.py'} --backend {backend}",
                       "nodes": ["ct200", "ct201"],
                       "torchrun": {"nproc_per_node": 1, "port": port, "collective_timeout": 60}},
            "watch": {"stall_timeout": 120, "sample_interval": 1}, "abort": {"grace": 10},
            "restart": {"max": 1, "on": ["fx-tracing-race"], "delay": 2}}, sort_keys=False))
        (case / "playbook.yaml").write_text(pb.read_text())
        dry = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb))
        (case / "dry-run.txt").write_text(dry.stdout + dry.stderr)
        t0 = time.time()
        started = gpuops("launch", "--detach", "--yes", "--json", "-i", str(inv), "-p", str(pb))
        (case / "launch.jsonl").write_text(started.stdout + started.stderr)
        if started.returncode != 0:
            print(started.stdout, started.stderr)
            return 1
        homes = {v: fake.home(v) for v in (200, 201)}
        run = (homes[200] / ".gpuops" / "sessions" / SESSION).read_text().strip()
        dirs = {v: homes[v] / ".gpuops" / "runs" / run for v in homes}
        # Nobody attached: wait for both nodes' attempt 1 to be over, then for attempt 2 to end.
        wait_until(lambda: all((d / "attempts" / "1" / "attempt.json").exists() for d in dirs.values()), timeout=300,
                   interval=0.5, message="attempt 1 ended on both nodes")
        wait_until(lambda: all((d / "exit_code").exists() for d in dirs.values()) and
                   all(json.loads((d / "watchdog.json").read_text()).get("state") == "done" for d in dirs.values()),
                   timeout=400, interval=0.5, message="attempt 2 ended on both nodes")
        follow = gpuops("logs", "-f", "--json", "-i", str(inv), "-p", str(pb))
        (case / "logs-follow.jsonl").write_text(follow.stdout + follow.stderr)
        runs = gpuops("runs", "--json", "-i", str(inv), "-p", str(pb))
        (case / "runs.jsonl").write_text(runs.stdout + runs.stderr)
        for vmid, d in dirs.items():
            shutil.copytree(d, case / f"ct{vmid}", ignore=shutil.ignore_patterns("*.lock", "env.sh", "*.fr"))
        evs = [json.loads(x) for d in dirs.values() for x in (d / "events.jsonl").read_text().splitlines()]
        line = min(e["ts"] for e in evs if e["event"] == "match" and e.get("rule") == "fx-tracing-race")
        gone = max(e.get("session_gone_at") or e["ts"] for e in evs if e["event"] == "aborted" and e["ts"] < line + 120)
        summary = {"run": run, "backend": backend, "fatal_line_to_last_session_gone_s": round(gone - line, 3),
                   "launch_to_end_s": round(time.time() - t0, 1), "logs_follow_exit": follow.returncode,
                   "torch": subprocess.run([PY, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                           text=True).stdout.strip()}
        (case / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(json.dumps(summary))
        return 0
    finally:
        for vmid in (200, 201):
            fake.tmux(vmid, "kill-server")
        fake.cleanup()
        sshd.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
