"""Throughput of the signature matcher against ``grep -E -c`` on the same synthetic log.

Writes a synthetic training log (step lines, tqdm bars redrawn with ``\\r``,
occasional warnings, one caught FX-race traceback and one recompile warning) to a
temporary file, then times, in the same run and on the same file:

* the Matcher (built-in rules plus the playbook rule ``loss (nan|inf)\\b``) fed in
  1 MiB chunks read from the file, once per engine: the standard-library search and,
  when installed, the hyperscan accelerator; each run in a fresh process (its own
  peak RSS), the hits of both checked equal,
* ``grep -E -c`` with equivalent patterns (page cache warm), its runs interleaved
  with the Matcher's (best of ``--runs`` each: other work on the machine adds noise), and
* for scale, the usual ``for line in file: regex.search(line)`` loop on the first 32 MiB.

Usage: python benchmarks/bench_scan.py [--size-mb 1024] [--chunk-kb 1024] [--runs 3]
       [--engine stdlib|hyperscan] [--extra-rules N] [--keep | --log PATH] [--json]

``--json`` ends the output with one line: matcher_mb_s (the faster engine), stdlib_mb_s,
hyperscan_mb_s (null when not installed), grep_mb_s, peak_rss_mb, engine, size_mb.
"""

from __future__ import annotations

import argparse
import json
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

from gpuops.agent.wire.signatures.matcher import Matcher, builtin_rules, regex_rule  # noqa: E402
from gpuops.client.view import accel  # noqa: E402

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

# ``--extra-rules N``: the first N of these playbook rules too (Python regex and POSIX ERE alike),
# for a playbook with many rules; several have no byte that is rare in the log.
EXTRA_RULES = [
    ("nan-detected", r"NaN detected"),
    ("grad-inf", r"grad_norm (inf|nan)"),
    ("killed", r"Killed process [0-9]+"),
    ("xid", r"NVRM: Xid"),
    ("ecc", r"uncorrectable ECC error"),
    ("bus-error", r"Bus error"),
    ("illegal-instruction", r"Illegal instruction"),
    ("connection-reset", r"ConnectionResetError"),
    ("connection-refused", r"Connection refused"),
    ("no-files", r"Too many open files"),
    ("no-space", r"No space left on device"),
    ("cudnn", r"cuDNN error: "),
    ("cublas", r"CUBLAS_STATUS_[A-Z_]+"),
    ("nccl-warn", r"NCCL WARN"),
    ("timed-out", r"timed out after [0-9]+"),
    ("heartbeat", r"missed heartbeat"),
    ("elastic", r"torch\.distributed\.elastic\.multiprocessing\.errors"),
    ("child-failed", r"ChildFailedError"),
    ("signal", r"received signal (SIGTERM|SIGKILL)"),
    ("exitcode", r"exitcode *: *-?[1-9]"),
    ("overflow", r"gradient overflow"),
    ("skip-step", r"skipping step"),
    ("loss-scale", r"loss scale reached minimum"),
    ("dataloader", r"DataLoader worker \(pid [0-9]+\) is killed"),
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


ENGINES = ("stdlib", "hyperscan")


def engine_available(engine: str) -> bool:
    return engine == "stdlib" or accel.available()


def time_matcher(path: Path, chunk: int, engine: str, extra: int = 0) -> tuple[float, list]:
    """One pass of the Matcher over the file, fed in ``chunk``-byte reads."""
    start = time.perf_counter()
    rules = builtin_rules() + [regex_rule("loss-nan", r"loss (nan|inf)\b")]
    rules += [regex_rule(name, pattern) for name, pattern in EXTRA_RULES[:extra]]
    matcher = Matcher(rules, prefilter=accel.hyperscan_prefilter if engine == "hyperscan" else None)
    hits = []
    with open(path, "rb", buffering=0) as f:
        while data := f.read(chunk):
            hits += matcher.feed(data)
    hits += matcher.finish()
    return time.perf_counter() - start, hits


def measure_child(path: Path, chunk: int, engine: str, extra: int) -> dict:
    """Time one engine in a fresh process, so its peak RSS is its own."""
    argv = [sys.executable, __file__, "--measure", engine, "--path", str(path), "--chunk-kb", str(chunk // 1024)]
    argv += ["--extra-rules", str(extra)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{engine} run failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM (ru_maxrss can carry the parent's from before exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(engine: str, path: Path, chunk: int, extra: int) -> None:
    """The child's side: one timed pass, then a JSON line with the time, the hits and the peak RSS."""
    secs, hits = time_matcher(path, chunk, engine, extra)
    rss = peak_rss_mib()
    found = [[h.rule, h.action, h.line_number, h.offset] for h in hits]
    print(json.dumps({"secs": secs, "peak_rss_mb": rss, "hits": found}))


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


def time_grep(path: Path, runs: int = 3, extra: int = 0) -> tuple[float, str]:
    grep = shutil.which("grep")
    if grep is None:
        raise SystemExit("grep not found")
    argv = [grep, "-E", "-c", "|".join(GREP_PATTERNS + [p for _, p in EXTRA_RULES[:extra]]), str(path)]
    best = float("inf")
    out = ""
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        best = min(best, time.perf_counter() - start)
        out = proc.stdout.strip()
    return best, out


def contest(path: Path, engines: list[str], args: argparse.Namespace) -> tuple[float, str, dict[str, dict]]:
    """grep and each engine, runs interleaved (noise hits them alike); the best time of each."""
    g_secs, g_count = float("inf"), ""
    results: dict[str, dict] = {}
    for _ in range(max(1, args.runs)):
        secs, g_count = time_grep(path, runs=1, extra=args.extra_rules)
        g_secs = min(g_secs, secs)
        for engine in engines:
            r = measure_child(path, args.chunk_kb * 1024, engine, args.extra_rules)
            kept = results.setdefault(engine, r)
            kept["secs"] = min(kept["secs"], r["secs"])
            kept["peak_rss_mb"] = max(kept["peak_rss_mb"], r["peak_rss_mb"])
            if r["hits"] != kept["hits"]:
                raise SystemExit(f"{engine}: hits differ between runs")
    first = next(iter(results.values()))
    if any(r["hits"] != first["hits"] for r in results.values()):
        raise SystemExit("the engines' hits differ")
    return g_secs, g_count, results


def report(size: int, g_secs: float, g_count: str, results: dict[str, dict], args: argparse.Namespace) -> dict:
    """Print the table; return the figures for --json."""
    g_rate = size / g_secs / 1e6
    rates = {e: size / r["secs"] / 1e6 for e, r in results.items()}
    print(f"grep -E -c          : {g_rate:8.0f} MB/s  ({g_secs:.2f} s, {g_count} matching lines)")
    for engine, r in results.items():
        print(
            f"Matcher ({engine:9s}): {rates[engine]:8.0f} MB/s  ({r['secs']:.2f} s, {len(r['hits'])} hits, "
            f"peak RSS {r['peak_rss_mb']:.0f} MiB, {rates[engine] / g_rate:.2f}x grep)"
        )
    n_secs, n_bytes = time_naive(args.path, 32 * MIB)
    naive = f"for line in file: regex.search, first {n_bytes / 1e6:.0f} MB"
    print(f"naive loop          : {n_bytes / n_secs / 1e6:8.0f} MB/s  ({naive})")
    rules = f"{len(builtin_rules()) + 1 + args.extra_rules} rules"
    print(f"best of {max(1, args.runs)} interleaved runs each; {args.chunk_kb} KiB feeds; {rules}")
    for rule, action, line_number, offset in next(iter(results.values()))["hits"]:
        print(f"  hit {rule} ({action}) line {line_number} offset {offset}")
    fastest = max(rates, key=rates.__getitem__)
    return {
        "matcher_mb_s": round(rates[fastest], 1),
        "stdlib_mb_s": round(rates["stdlib"], 1) if "stdlib" in rates else None,
        "hyperscan_mb_s": round(rates["hyperscan"], 1) if "hyperscan" in rates else None,
        "grep_mb_s": round(g_rate, 1),
        "peak_rss_mb": round(max(r["peak_rss_mb"] for r in results.values()), 1),
        "engine": fastest,
        "size_mb": round(size / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the synthetic log (MiB)")
    parser.add_argument("--chunk-kb", type=int, default=1024, help="feed size (KiB)")
    parser.add_argument("--runs", type=int, default=3, help="runs of grep and of each engine, interleaved; best counts")
    parser.add_argument("--engine", choices=ENGINES, action="append", help="engine to time (default: each available)")
    parser.add_argument(
        "--extra-rules", type=int, default=0, help=f"add this many playbook rules (up to {len(EXTRA_RULES)})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated log and print its path")
    parser.add_argument("--log", type=Path, help="time this log (left in place) instead of writing one")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    parser.add_argument("--measure", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.path, args.chunk_kb * 1024, args.extra_rules)
        return
    engines = [e for e in (args.engine or ENGINES) if engine_available(e)]
    if not engines:
        raise SystemExit("no engine available (hyperscan not installed?)")
    if args.log:
        args.path = args.log
        print(f"log: {args.path} {args.path.stat().st_size / 1e6:.0f} MB (given)")
    else:
        fd, name = tempfile.mkstemp(prefix="gpuops-scan-bench-", suffix=".log")
        os.close(fd)
        args.path = Path(name)
    try:
        if not args.log:
            t0 = time.perf_counter()
            write_log(args.path, args.size_mb)
            print(f"log: {args.path} {args.path.stat().st_size / 1e6:.0f} MB, written in {time.perf_counter() - t0:.1f} s")
        with open(args.path, "rb") as f:  # warm the page cache for every contestant
            while f.read(16 * MIB):
                pass
        figures = report(args.path.stat().st_size, *contest(args.path, engines, args), args)
        if args.json:
            print(json.dumps(figures))
    finally:
        if args.keep and not args.log:
            print(f"kept {args.path}")
        elif not args.log:
            args.path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
