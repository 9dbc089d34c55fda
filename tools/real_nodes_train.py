"""A two-node trainer for tools/real_nodes.py, run by REAL torchrun: gloo (or NCCL) all-reduces each step.

On attempt 1 (TORCHELASTIC_RUN_ID without an -aN suffix), the node with GROUP_RANK 1 hits the REAL
FX-tracing race at step --fail-at: a drafter thread symbolically traces a module that calls a
torch.compile'd function, dynamo raises its RuntimeError in that thread, the thread dies with
Python's traceback and the process trains on (as real drafters do). Attempt 2 trains to the end.
With --skip-at N (tools/real_hang.py) the rank of GROUP_RANK 1 goes elsewhere at step N instead (load_batch:
asleep) and never makes that all_reduce, and init_process_group gets no timeout of its own (the job's comes
through gpuops' sitecustomize).
"""

import argparse
import datetime
import os
import re
import threading
import time

import torch
import torch.distributed as dist


def fx_race() -> None:
    compiled = torch.compile(lambda x: x * 2)

    class M(torch.nn.Module):
        def forward(self, x):
            return compiled(x)

    torch.fx.symbolic_trace(M())  # raises: FX tracing a dynamo-optimized function


def load_batch() -> None:
    time.sleep(3600)  # elsewhere: a data loader that never returns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--fail-at", type=int, default=8)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--skip-at", type=int, default=0)
    a = ap.parse_args()
    timeout = float(os.environ.get("GPUOPS_COLLECTIVE_TIMEOUT") or 120)
    if a.skip_at:
        dist.init_process_group(a.backend)
    else:
        dist.init_process_group(a.backend, timeout=datetime.timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    group = int(os.environ["GROUP_RANK"])
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    first = not re.search(r"-a\d+$", run_id)  # attempt 1: the run id itself; attempt N: <run>-aN
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())) \
        if torch.cuda.is_available() else torch.device("cpu")
    w = torch.randn(256, 256, device=dev)
    print(f"rank {rank} of {world} group {group} rdzv {run_id} backend {a.backend} device {dev}", flush=True)
    for step in range(1, a.steps + 1):
        if a.skip_at and group == 1 and step == a.skip_at:
            print(f"step {step}: rank {rank} goes elsewhere", flush=True)
            load_batch()
        loss = (w @ w).float().mean()
        t = torch.tensor([float(loss)], device=dev if a.backend == "nccl" else "cpu")
        dist.all_reduce(t)
        print(f"step {step}/{a.steps} loss {float(t) / world:.4f}", flush=True)
        if first and group == 1 and step == a.fail_at:
            threading.Thread(target=fx_race, name="drafter-1").start()
        time.sleep(a.interval)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
