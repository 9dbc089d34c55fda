"""A speculative-decoding drafter's training loop, as the incident had it: drafter threads running
flex_attention forward and backward, compiled (torch.compile) or in the eager fallback.

For checking gpuops' watchdog and quiet-failure detectors against real PyTorch on a real GPU
(tools/real_h200.sh drives it over the real-sshd bench):

    python3 tools/real_drafter.py warmup --shapes 2048             # compile each shape, one thread
    python3 tools/real_drafter.py train --shapes 2048 --seconds 40  # compiled, warmed shapes: the baseline
    python3 tools/real_drafter.py train --eager ...                 # the eager fallback (5x slower, more memory)
    python3 tools/real_drafter.py train --shapes 1024,2048,4096    # shapes the warmup missed: compiles now
    python3 tools/real_drafter.py train --fx-race ...              # the FX-tracing race after a few steps
    python3 tools/real_drafter.py train --cold --hang-dump 90      # cold-cache compile in 3 threads at once
    python3 tools/real_drafter.py train --module --steps 20         # each thread trains its own compiled nn.Module

Every second the main thread prints `step N loss X tok/s Y` (tokens of all threads over that second).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import threading
import time


def _attention(eager: bool):
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention if eager else torch.compile(flex_attention)


def _qkv(shape: int, device: str, heads: int, dim: int):
    import torch

    cuda = device.startswith("cuda")  # FlexAttention has no backward on the CPU (a smoke test there runs forward only)
    dtype = torch.bfloat16 if cuda else torch.float32
    return [torch.randn(4, heads, shape, dim, device=device, dtype=dtype, requires_grad=cuda) for _ in range(3)]


def _step(attn, qkv) -> float:
    out = attn(*qkv)
    loss = out.float().pow(2).mean()
    if loss.requires_grad:
        loss.backward()
    return float(loss.detach())


def _drafter_module(device: str, heads: int, dim: int, api: str = "method"):
    """A small drafter block (Linear + flex_attention), compiled as a module with nn.Module.compile()."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(dim, 3 * dim)

        def forward(self, x):
            q, k, v = self.proj(x).chunk(3, dim=-1)
            return flex_attention(q.contiguous(), k.contiguous(), v.contiguous())

    cuda = device.startswith("cuda")
    block = Block().to(device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    opt = torch.optim.SGD(block.parameters(), lr=1e-3)
    if api == "function":  # torch.compile(module): an OptimizedModule around it
        return torch.compile(block), opt
    block.compile()  # nn.Module.compile(): compiles the module's call in place
    return block, opt


def _train_module(block, opt, shape: int, device: str, heads: int, dim: int) -> float:
    import torch

    cuda = device.startswith("cuda")
    x = torch.randn(4, heads, shape, dim, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    loss = block(x).float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def warmup(args: argparse.Namespace) -> int:
    """One thread compiles flex_attention forward and backward for every shape, one after another."""
    attn = _attention(eager=False)
    for shape in args.shapes:
        t0 = time.time()
        _step(attn, _qkv(shape, args.device, args.heads, args.dim))
        print(f"warmup {args.device}: compiled flex_attention fwd+bwd seq_len={shape} in {time.time() - t0:.1f}s",
              flush=True)
    return 0


class Counter:
    def __init__(self) -> None:
        self.tokens = 0
        self.loss = 0.0
        self.finished = 0  # drafter threads that ran all their --steps
        self.lock = threading.Lock()

    def add(self, tokens: int, loss: float) -> None:
        with self.lock:
            self.tokens += tokens
            self.loss = loss

    def done(self, index: int, steps: int) -> None:
        with self.lock:
            self.finished += 1
        print(f"drafter-{index + 1}: {steps} steps done", flush=True)


def _drafter(args: argparse.Namespace, attn, counter: Counter, stop: threading.Event, index: int) -> None:
    """Steps over the shapes in turn until told to stop (an exception kills this thread only, as in the incident)."""
    shapes = args.shapes
    i = index
    module = _drafter_module(args.device, args.heads, args.dim, args.module_api) if args.module else None
    while not stop.is_set() and (not args.steps or i - index < args.steps):
        shape = shapes[i % len(shapes)]
        i += 1
        if module is not None:
            loss = _train_module(*module, shape, args.device, args.heads, args.dim)
        else:
            loss = _step(attn, _qkv(shape, args.device, args.heads, args.dim))
        counter.add(4 * shape, loss)
    counter.done(index, i - index)


def _fx_race(attn) -> None:
    """PyTorch < 2.14's is-fx-tracing flag is process-global: a thread inside symbolic_trace while the
    drafters call the compiled function makes them raise the FX-tracing race."""
    import torch

    class Traced(torch.nn.Module):
        def forward(self, x):
            time.sleep(5)  # drafters run compiled steps meanwhile
            return x + 1

    threading.Thread(target=lambda: torch.fx.symbolic_trace(Traced()), name="fx-tracer", daemon=True).start()


def train(args: argparse.Namespace) -> int:
    if args.hang_dump:
        faulthandler.dump_traceback_later(args.hang_dump, exit=False)
    attn = None if args.module else _attention(eager=args.eager)
    counter, stop = Counter(), threading.Event()
    threads = [threading.Thread(target=_drafter, args=(args, attn if args.shared or args.module else _attention(args.eager), counter,
                                                       stop, i), name=f"drafter-{i + 1}", daemon=True)
               for i in range(args.threads)]
    for t in threads:
        t.start()
    started = last = time.time()
    step, seen = 0, 0
    while time.time() - started < args.seconds:
        time.sleep(1.0)
        now = time.time()
        with counter.lock:
            tokens, loss = counter.tokens, counter.loss
        step += 1
        if tokens > seen:  # a compile that hangs prints nothing: the log goes silent, as in the incident
            print(f"step {step} loss {loss:.4f} tok/s {(tokens - seen) / (now - last):.0f}", flush=True)
        seen, last = tokens, now
        if args.fx_race and step == args.fx_race:
            _fx_race(attn)
        if not any(t.is_alive() for t in threads):
            if args.steps:  # every thread ran its steps: the run is complete
                break
            print("all drafter threads died", flush=True)
            return 1
    stop.set()
    for t in threads:
        t.join(60)
    if args.steps and counter.finished < len(threads):
        print(f"only {counter.finished} of {len(threads)} drafter threads finished their steps", flush=True)
        return 1
    print(f"done: {step} steps", flush=True)
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="real_drafter.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("warmup", "train"):
        p = sub.add_parser(name)
        p.add_argument("--shapes", type=lambda s: [int(x) for x in s.split(",")], default=[2048])
        p.add_argument("--device", default="cuda:" + os.environ.get("GPUOPS_GPU", "0"))
        p.add_argument("--heads", type=int, default=8)
        p.add_argument("--dim", type=int, default=64)
        if name == "train":
            p.add_argument("--threads", type=int, default=3)
            p.add_argument("--seconds", type=float, default=40.0)
            p.add_argument("--eager", action="store_true", help="no torch.compile: the eager fallback")
            p.add_argument("--shared", action="store_true", help="the threads share one compiled function")
            p.add_argument("--fx-race", type=int, default=0, help="start the FX-tracing race at this step")
            p.add_argument("--cold", action="store_true", help="(documentation) run with an empty inductor cache")
            p.add_argument("--hang-dump", type=float, default=0.0, help="faulthandler dumps the stacks after N s")
            p.add_argument("--module", action="store_true", help="each thread trains its own nn.Module.compile()d block")
            p.add_argument("--module-api", choices=["method", "function"], default="method",
                           help="--module compiles with nn.Module.compile() (method) or torch.compile(module)")
            p.add_argument("--steps", type=int, default=0, help="each thread runs this many steps, then the run ends (0: --seconds)")
    args = ap.parse_args(argv)
    return warmup(args) if args.cmd == "warmup" else train(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
