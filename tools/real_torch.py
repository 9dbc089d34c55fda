"""Real PyTorch failures on a real CUDA GPU, for checking gpuops against the real thing.

Run on a machine with an NVIDIA GPU and PyTorch (tools/device_check.sh drives it):

    python3 tools/real_torch.py warmup --gpu 0           # torch.compile warmup, exits 0
    python3 tools/real_torch.py train --fail fx-race     # the FX-tracing race between threads, keeps running
    python3 tools/real_torch.py train --fail fx-caught   # the race caught, logged, eager fallback, keeps running
    python3 tools/real_torch.py train --fail oom         # torch.OutOfMemoryError, exits 1
    python3 tools/real_torch.py train --fail assert      # CUDA device-side assert, exits 1
    python3 tools/real_torch.py hold --gpu 0 --gib 4     # holds GPU memory (a busy GPU for preflight)

The FX race is reproduced the way it happens in a drafter: one thread is inside
torch.fx.symbolic_trace (PyTorch's is-fx-tracing flag is process-global before 2.14)
while other threads call a torch.compile'd function.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time


def _device(gpu: int | None) -> str:
    return f"cuda:{gpu if gpu is not None else int(os.environ.get('GPUOPS_GPU', '0'))}"


def warmup(gpu: int) -> int:
    import torch

    dev = _device(gpu)
    fn = torch.compile(lambda x, w: torch.nn.functional.gelu(x @ w).sum())
    for i, n in enumerate((64, 128, 256), 1):
        t0 = time.time()
        fn(torch.randn(n, 512, device=dev), torch.randn(512, 512, device=dev)).item()
        print(f"warmup {dev}: compiled shape {i}/3 (n={n}) in {time.time() - t0:.1f}s", flush=True)
    return 0


def _fx_race(caught: bool, dev: str) -> None:
    import torch

    step_fn = torch.compile(lambda x, w: (x @ w).relu().sum())
    w = torch.randn(32, 32, device=dev)
    step_fn(torch.randn(4, 32, device=dev), w)  # compiled before the race, as after a warmup
    inside = threading.Event()
    done = threading.Event()

    class Traced(torch.nn.Module):
        def forward(self, x):  # runs under symbolic_trace: the global flag is set
            inside.set()
            done.wait(30)
            return x + 1

    def tracer() -> None:
        torch.fx.symbolic_trace(Traced())

    def drafter() -> None:
        inside.wait(30)
        if caught:
            try:
                step_fn(torch.randn(4, 32, device=dev), w)
            except RuntimeError:
                logging.getLogger("drafter").exception("torch.compile failed in %s, falling back to eager", threading.current_thread().name)
        else:
            step_fn(torch.randn(4, 32, device=dev), w)

    t = threading.Thread(target=tracer, name="fx-tracer")
    t.start()
    drafters = [threading.Thread(target=drafter, name=f"drafter-{i}") for i in (1, 2, 3)]
    for d in drafters:
        d.start()
    for d in drafters:
        d.join()
    done.set()
    t.join()


def train(fail: str, steps: int, fail_at: int, gpu: int | None) -> int:
    import torch

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO, stream=sys.stdout)
    dev = _device(gpu)
    w = torch.randn(1024, 1024, device=dev, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-3)
    interval = 0.05
    for step in range(1, steps + 1):
        x = torch.randn(256, 1024, device=dev)
        loss = (x @ w).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}/{steps} loss {loss.item():.4f}", flush=True)
        if step == fail_at:
            if fail in ("fx-race", "fx-caught"):
                _fx_race(fail == "fx-caught", dev)
                interval *= 10  # the eager fallback: the process goes on, much slower
            elif fail == "oom":
                torch.empty(int(4e12), dtype=torch.uint8, device=dev)
            elif fail == "assert":
                torch.arange(4, device=dev)[torch.tensor([10], device=dev)].item()
        time.sleep(interval)
    return 0


def hold(gpu: int, gib: float, seconds: float) -> int:
    import torch

    x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=_device(gpu))
    print(f"holding {x.numel() >> 20} MiB on {_device(gpu)}", flush=True)
    time.sleep(seconds)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("warmup")
    w.add_argument("--gpu", type=int, default=None)
    t = sub.add_parser("train")
    t.add_argument("--fail", choices=["none", "fx-race", "fx-caught", "oom", "assert"], default="none")
    t.add_argument("--steps", type=int, default=400)
    t.add_argument("--fail-at", type=int, default=10)
    t.add_argument("--gpu", type=int, default=None)
    h = sub.add_parser("hold")
    h.add_argument("--gpu", type=int, default=0)
    h.add_argument("--gib", type=float, default=4)
    h.add_argument("--seconds", type=float, default=60)
    a = ap.parse_args()
    if a.cmd == "warmup":
        return warmup(a.gpu if a.gpu is not None else 0)
    if a.cmd == "hold":
        return hold(a.gpu, a.gib, a.seconds)
    return train(a.fail, a.steps, a.fail_at, a.gpu)


if __name__ == "__main__":
    sys.exit(main())
