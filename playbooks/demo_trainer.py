"""`python3 demo_trainer.py warmup|train`: the workload of playbooks/demo.yaml (standard library only).

A file beside the playbook, not a module of gpuops: the demo runs with whatever python3 the machine
has, however gpuops itself was installed (an unactivated venv, pipx).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import threading
import time

FX_MESSAGE = (
    "Detected that you are using FX to symbolically trace a dynamo-optimized function. "
    "This is not supported at the moment."
)


def warmup(gpu: int, steps: int, interval: float) -> int:
    """What a torch.compile warmup prints: one line per compiled shape."""
    print(f"GPUOPS_GPU={os.environ.get('GPUOPS_GPU')} compiling flex_attention", flush=True)
    for i in range(1, steps + 1):
        time.sleep(interval)
        print(f"compiled shape {i}/{steps} (seq_len={256 * i})", flush=True)
    print(f"warmup of GPU {gpu} done", flush=True)
    return 0


def _raise_fx_race() -> None:
    raise RuntimeError(FX_MESSAGE)


def _drafter(name: str, fail: bool) -> None:
    if fail:
        _raise_fx_race()


def train(steps: int, interval: float, fail_at: int) -> int:
    """Training lines, then the race in a drafter thread; the process carries on in 'eager' mode."""
    logging.basicConfig(format="%(asctime)s %(levelname)s [%(threadName)s] %(message)s", level=logging.INFO, stream=sys.stdout)
    rng = random.Random(0)
    loss = 4.0
    for step in range(1, steps + 1):
        loss *= 0.97 + rng.random() * 0.01
        print(f"step {step}/{steps} loss {loss:.4f} lr 3.0e-04 tok/s 48210", flush=True)
        if step == fail_at:
            t = threading.Thread(target=_drafter, args=("drafter-1", True), name="drafter-1")
            t.start()  # an uncaught exception in a thread: Python prints "Exception in thread ..." and the traceback
            t.join()
            sys.stdout.flush()
            sys.stderr.flush()
            logging.getLogger("drafter").warning("drafter-1 compile failed; falling back to eager mode (slow)")
            interval *= 8
        time.sleep(interval)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 demo_trainer.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("warmup")
    w.add_argument("--gpu", type=int, required=True)
    w.add_argument("--steps", type=int, default=3)
    w.add_argument("--interval", type=float, default=0.3)
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--interval", type=float, default=0.1)
    t.add_argument("--fail-at", type=int, default=12, help="step at which the FX-tracing race hits (0: never)")
    args = ap.parse_args(argv)
    if args.cmd == "warmup":
        return warmup(args.gpu, args.steps, args.interval)
    return train(args.steps, args.interval, args.fail_at)


if __name__ == "__main__":
    sys.exit(main())
