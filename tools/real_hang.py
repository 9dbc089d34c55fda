"""The hung torchrun job on a real GPU machine (tools/real_nodes.py --hang): two nodes, real torchrun and torch,
gloo, node 1's rank never joins its 6th all_reduce (tools/real_nodes_train.py --skip-at 6), nobody attached.

Both nodes must stop for the stall; before each abort's signal every rank's Flight Recorder is dumped by gpuops'
helper thread in the training's torch and the nodes exchange their summaries through torchrun's store. What comes
back is seven files in OUTDIR/nodes-hang/ (the device tool brings back eight at most): ct200.json and ct201.json
(each node's abort.json, abort-done.json, meta.json, events, every stacks text and Flight Recorder record of its
run directory's stacks/ folder, the log's tail), logs-stacks.txt, logs-follow.jsonl, notified.jsonl (each node's
`aborted` notification), playbook.yaml and summary.json (seconds from the skip to the last node's abort, the
torch version). tests/real/test_real_h200_hang.py reads the verdict again from them through gpuops' own code.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict

import yaml
from bench import FakeProxmox, wait_until
from real_h200 import PY

ROOT = Path(__file__).resolve().parent.parent
SESSION = "nodes"
STALL = 45  # seconds: above real torchrun's silent start (imports, rendezvous) on a GPU machine


def _bundle(d: Path) -> Dict[str, Any]:
    """A node's run directory as the test needs it: its records, and every stacks text and recorder record."""
    def read(name: str) -> Any:
        path = d / name
        return json.loads(path.read_text()) if path.exists() else None

    stacks = d / "stacks"
    return {
        "abort": read("abort.json"), "abort_done": read("abort-done.json"), "meta": read("meta.json"),
        "job_end": read("job-end.json"),
        "events": [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines() if x.strip()],
        "stacks": {p.name.split(".")[0]: p.read_text(errors="replace") for p in sorted(stacks.glob("*.txt"))},
        "flight": {p.name.split(".")[0]: json.loads(p.read_text()) for p in sorted(stacks.glob("*.flight.json"))},
        "log_tail": (d / "log").read_text(errors="replace")[-4000:] if (d / "log").exists() else "",
    }


def hang_case(case: Path, work: Path, inv: Path, fake: FakeProxmox, port: int,
              gpuops: Callable[..., subprocess.CompletedProcess]) -> int:
    sent = case / "notified.jsonl"
    pb = work / "playbook.yaml"
    pb.write_text(yaml.safe_dump({
        "name": "real-hang", "env": {},
        "launch": {"session": SESSION, "command": f"{ROOT / 'tools' / 'real_nodes_train.py'} --skip-at 6 --steps 40",
                   "nodes": ["ct200", "ct201"], "torchrun": {"nproc_per_node": 1, "port": port}},
        "watch": {"stall_timeout": STALL, "sample_interval": 1}, "abort": {"grace": 10},
        "notify": [{"on": ["aborted"], "command": f'cat "$GPUOPS_NOTIFY_JSON" >> {sent}'}]}, sort_keys=False))
    (case / "playbook.yaml").write_text(pb.read_text())
    t0 = time.time()
    started = gpuops("launch", "--detach", "--yes", "--json", "-i", str(inv), "-p", str(pb))
    if started.returncode != 0:
        print(started.stdout, started.stderr)
        return 1
    homes = {v: fake.home(v) for v in (200, 201)}
    run = (homes[200] / ".gpuops" / "sessions" / SESSION).read_text().strip()
    dirs = {v: homes[v] / ".gpuops" / "runs" / run for v in homes}
    # Nobody attached: both nodes stop for the stall, each after its ranks' stacks and recorders.
    wait_until(lambda: all((d / "watchdog.json").exists() and json.loads((d / "watchdog.json").read_text())
                           .get("state") == "done" for d in dirs.values()), timeout=300, interval=0.5,
               message="both nodes stopped and their watchdogs done")
    wait_until(lambda: sent.exists() and len(sent.read_text().splitlines()) >= 2, timeout=60, interval=0.5,
               message="both nodes' aborted notifications")
    stacks = gpuops("logs", "--stacks", "-i", str(inv), "-p", str(pb))
    (case / "logs-stacks.txt").write_text(f"## exit {stacks.returncode}\n## stdout\n{stacks.stdout}## stderr\n{stacks.stderr}")
    follow = gpuops("logs", "-f", "--json", "-i", str(inv), "-p", str(pb))
    (case / "logs-follow.jsonl").write_text(follow.stdout + follow.stderr)
    for vmid, d in dirs.items():
        (case / f"ct{vmid}.json").write_text(json.dumps(_bundle(d), indent=1) + "\n")
    evs = [e for d in dirs.values() for e in _bundle(d)["events"]]
    aborted = [e for e in evs if e["event"] == "aborted"]
    log1 = (dirs[201] / "log").read_text(errors="replace")
    summary = {"run": run, "backend": "gloo", "stall_timeout": STALL, "launch_to_end_s": round(time.time() - t0, 1),
               "abort_seconds": [e.get("seconds") for e in aborted], "logs_follow_exit": follow.returncode,
               "skip_seen": "goes elsewhere" in log1,
               "torch": subprocess.run([PY, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                       text=True).stdout.strip()}
    (case / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0
