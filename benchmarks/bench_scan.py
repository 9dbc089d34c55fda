"""Throughput of the signature matcher against ``grep -E -c`` on the same synthetic log.

Writes a synthetic training log (step lines, tqdm bars redrawn with ``\\r``,
occasional warnings, one caught FX-race traceback and one recompile warning) to a
temporary file, then times, in the same run and on the same file:

* the Matcher (built-in rules plus the playbook rule ``loss (nan|inf)\\b``) fed in
  1 MiB chunks read from the file,
* ``grep -E -c`` with equivalent patterns (best of a few runs, page cache warm), and
* for scale, the usual ``for line in file: regex.search(line)`` loop on the first 32 MiB.

Usage: python benchmarks/bench_scan.py [--size-mb 1024] [--chunk-kb 1024] [--keep]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuops.signatures.matcher import Matcher, builtin_rules, regex_rule  # noqa: E402

MIB = 1 << 20

# What grep searches: the built-in library and the playbook rule, as POSIX EREs.
GREP_PATTERNS = [
    r"^Traceback \(most recent call last\):",
    r"Detected that you are using FX to symbolically trace a dynamo-optimized function",
    r"(OutOfMemoryError|RuntimeError): CUDA out of memory",
    r"(AcceleratorError|RuntimeError): CUDA error: ",
    r"Watchdog caught collective operation timeout",
    r"(NCCL error|NCCL communicator was aborted)",
    r"torch\._dynamo\.exc\.BackendCompilerFailed:|torch\._inductor\.exc\.InductorError:",
    r"^Fatal Python error: |Segmentation fault",
    r"^Timeout \([0-9]+:[0-9][0-9]:[0-9][0-9]",
    r"dynamo hit config\.[a-z_]*(recompile_limit|cache_size_limit) \([0-9]+\)",
    r"loss (nan|inf)\b",
]

FX_TRACEBACK = """2026-11-29 10:00:01,234 ERROR [drafter-2] compile failed, falling back to eager
Traceback (most recent call last):
  File "/root/dflash/train_drafter.py", line 41, in drafter_step
    out = self.compiled(x, w)
          ^^^^^^^^^^^^^^^^^^^
  File "/usr/local/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 1120, in compile_wrapper
    raise RuntimeError(
RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. This is not supported at the moment.
"""
RECOMPILE = (
    "W1129 10:50:01.345000 4242 torch/_dynamo/convert_frame.py:1016] [0/8] "
    "torch._dynamo hit config.recompile_limit (8)\n"
)
WARNING = (
    "/usr/local/lib/python3.11/site-packages/torch/_inductor/lowering.py:7007: UserWarning: "
    "Online softmax is disabled on the fly since Inductor decides to split the reduction.\n"
    "  warnings.warn(\n"
)


def _block(rnd: random.Random, first_step: int, size: int) -> tuple[str, int]:
    """About ``size`` bytes of ordinary training output; returns it and the next step."""
    out: list[str] = []
    n = 0
    step = first_step
    while n < size:
        r = rnd.random()
        if r < 0.6:
            step += 1
            s = (
                f"2026-11-29 10:{step // 600 % 60:02d}:{step // 10 % 60:02d},{step % 1000:03d} INFO step {step} "
                f"loss {rnd.uniform(1, 3):.4f} lr 3.0e-04 grad_norm {rnd.uniform(0, 2):.2f} "
                f"tok/s {rnd.randint(40000, 50000)}\n"
            )
        elif r < 0.995:
            p = rnd.randint(0, 95)
            s = "".join(
                f"\r{q:3d}%|{'█' * (q // 10)}{' ' * (10 - q // 10)}| {q}/100 [00:{q // 10:02d}<00:{(100 - q) // 10:02d}, 9.8it/s]"
                for q in range(p, p + 5)
            )
            if rnd.random() < 0.2:
                s += "\n"
        else:
            s = WARNING
        out.append(s)
        n += len(s)
    return "".join(out), step


def write_log(path: Path, size_mb: int, seed: int = 1) -> None:
    """Write the synthetic log: cycles through a few distinct blocks, specials spliced in."""
    rnd = random.Random(seed)
    blocks = []
    step = 0
    for _ in range(8):
        text, step = _block(rnd, step, MIB)
        blocks.append(text.encode())
    total = size_mb * MIB
    written = 0
    i = 0
    with open(path, "wb") as f:
        while written < total:
            if i == size_mb // 3:
                f.write(RECOMPILE.encode())
            if i == size_mb // 2:
                f.write(FX_TRACEBACK.encode())
            block = blocks[i % len(blocks)][: total - written]
            f.write(block)
            written += len(block)
            i += 1


def time_matcher(path: Path, chunk: int) -> tuple[float, list]:
    rules = builtin_rules() + [regex_rule("loss-nan", r"loss (nan|inf)\b")]
    matcher = Matcher(rules)
    hits = []
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while data := f.read(chunk):
            hits += matcher.feed(data)
    hits += matcher.finish()
    return time.perf_counter() - start, hits


def time_naive(path: Path, limit: int) -> tuple[float, int]:
    """The usual Python loop for scale: ``for line in file: regex.search(line)``, first ``limit`` bytes.

    It splits at LF only and knows nothing of tracebacks, CR or escape sequences.
    """
    import re

    regex = re.compile("|".join(GREP_PATTERNS).encode())
    done = 0
    start = time.perf_counter()
    with open(path, "rb") as f:
        for line in f:
            if regex.search(line):
                pass
            done += len(line)
            if done >= limit:
                break
    return time.perf_counter() - start, done


def time_grep(path: Path, runs: int = 3) -> tuple[float, str]:
    grep = shutil.which("grep")
    if grep is None:
        raise SystemExit("grep not found")
    argv = [grep, "-E", "-c", "|".join(GREP_PATTERNS), str(path)]
    best = float("inf")
    out = ""
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        best = min(best, time.perf_counter() - start)
        out = proc.stdout.strip()
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the synthetic log (MiB)")
    parser.add_argument("--chunk-kb", type=int, default=1024, help="feed size (KiB)")
    parser.add_argument("--keep", action="store_true", help="keep the generated log and print its path")
    args = parser.parse_args()

    fd, name = tempfile.mkstemp(prefix="gpuops-scan-bench-", suffix=".log")
    os.close(fd)
    path = Path(name)
    try:
        t0 = time.perf_counter()
        write_log(path, args.size_mb)
        size = path.stat().st_size
        print(f"log: {path} {size / 1e6:.0f} MB, written in {time.perf_counter() - t0:.1f} s")
        with open(path, "rb") as f:  # warm the page cache for both contestants
            while f.read(16 * MIB):
                pass
        g_secs, g_count = time_grep(path)
        m_secs, hits = time_matcher(path, args.chunk_kb * 1024)
        n_secs, n_bytes = time_naive(path, 32 * MIB)
        g_rate = size / g_secs / 1e6
        m_rate = size / m_secs / 1e6
        rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rss_grep = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"grep -E -c : {g_rate:8.0f} MB/s  ({g_secs:.2f} s, {g_count} matching lines, peak RSS {rss_grep:.0f} MiB)")
        print(f"Matcher    : {m_rate:8.0f} MB/s  ({m_secs:.2f} s, {len(hits)} hits, peak RSS {rss_self:.0f} MiB)")
        print(f"ratio      : {m_rate / g_rate:.2f}x grep")
        print(f"naive loop : {n_bytes / n_secs / 1e6:8.0f} MB/s  (for line in file: regex.search, first {n_bytes / 1e6:.0f} MB)")
        for hit in hits:
            print(f"  hit {hit.rule} ({hit.action}) line {hit.line_number} offset {hit.offset}")
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
