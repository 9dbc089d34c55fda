"""What the watchdog costs the target: CPU and memory while a trainer writes 20 MB/s of log, CPU
while a run logs little and its 8 GPUs are sampled every 2 s, and the telemetry files' growth.

The watchdog is no child of the benchmark (its supervisor started it, detached): its CPU is read
from /proc/<pid>/stat (utime + stime), its memory from /proc/<pid>/status (VmRSS).
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import Row, Site, children, cpu_times, rss_mib, wait_for

from bench.watchdog import heartbeat, wait_watching
from bench_scan import GREP_PATTERNS

from gpuops.agent.detect.telemetry import TelemetryLog

RATE = 20_000_000
WINDOW = 2.0  # seconds per CPU figure
#: Runs a command and prints its CPU seconds and peak RSS (KiB) as JSON: the baseline's own figures.
MEASURE = ("import json, resource, subprocess, sys\n"
           "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
           "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
           "print(json.dumps({'cpu': r.ru_utime + r.ru_stime, 'rss_kib': r.ru_maxrss}))\n")


def _measured(argv: list[str]) -> dict[str, float]:
    """CPU seconds and peak RSS of argv alone (a fresh parent, so no other child counts)."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _watch(d: Path, pid: int) -> list[tuple[float, float, float, int, float]]:
    """(time, CPU s, RSS MiB, log bytes, CPU s of the children it ran) of the watchdog every 0.5 s
    until the trainer has exited."""
    out = []
    while True:
        t, cpu, rss = time.time(), cpu_times(pid), rss_mib(pid)
        if cpu is None or rss is None:
            return out
        out.append((t, cpu[0], rss, (d / "log").stat().st_size, cpu[1]))
        if (d / "exit_code").exists():
            return out
        time.sleep(0.5)


def _windows(samples: list[tuple[float, float, float, int, float]]) -> list[float]:
    """CPU percent of one core over consecutive windows of about WINDOW seconds."""
    out, start = [], samples[0]
    for s in samples[1:]:
        if s[0] - start[0] >= WINDOW:
            out.append(100 * (s[1] - start[1]) / (s[0] - start[0]))
            start = s
    return out


def bench_wd_cpu(args: Any) -> list[Row]:
    """Row 2: the watchdog's CPU and RSS while fake-train writes --wd-mb MB at 20 MB/s."""
    site = Site(Path(tempfile.mkdtemp(prefix="gpuops-bench-")))
    try:
        seconds = args.wd_mb * 1e6 / RATE
        pb = site.playbook("rate", f"fake-train --mode rate --bytes-per-sec {RATE} --duration {seconds:g} --gpus 5,6")
        d = site.run_dir(site.launch_detached(pb))
        pid = wait_watching(d)
        samples = _watch(d, pid)
        wait_for(lambda: heartbeat(d).get("state") == "done", 120, "the watchdog to read the log's end", interval=0.05)
        size = (d / "log").stat().st_size
        lag = float(heartbeat(d)["ts"]) - (d / "exit_code").stat().st_mtime
        grep = _measured(["grep", "-E", "-c", "|".join(GREP_PATTERNS), str(d / "log")])
        cat = _measured(["cat", str(d / "log")])
    finally:
        site.close()
    wall = samples[-1][0] - samples[0][0]
    cpu = samples[-1][1] - samples[0][1]
    kids = samples[-1][4] - samples[0][4]
    written = (samples[-1][3] - samples[0][3]) / wall / 1e6
    rss = [s[2] for s in samples]
    return [
        Row(f"watchdog CPU, fake-train at 20 MB/s ({size / 1e6:.0f} MB of log)", _windows(samples), unit="%",
            baseline_name="grep -E -c of the same bytes, same time", baseline=[100 * grep["cpu"] / wall],
            target="<= 10% of one core", met=100 * cpu / wall <= 10,
            note=f"{cpu:.2f} CPU s over {wall:.1f} s = {100 * cpu / wall:.1f}% of one core ({WINDOW:g} s windows above), "
                 f"and {100 * kids / wall:.1f}% more in the commands it ran and reaped (tmux, nvidia-smi); "
                 f"the log grew {written:.1f} MB/s; the watchdog had read it all and recorded the end "
                 f"{lag:.2f} s after the trainer exited; "
                 f"grep {grep['cpu']:.2f} CPU s, cat {cat['cpu']:.2f} CPU s ({100 * cat['cpu'] / wall:.1f}%) for the same bytes"),
        Row(f"watchdog RSS over {size / 1e6:.0f} MB of log (sampled every 0.5 s)", rss, unit="MiB",
            baseline_name="grep -E -c peak RSS, same bytes", baseline=[grep["rss_kib"] / 1024],
            target="flat, <= 40 MB", met=max(rss) * 1.048576 <= 40 and max(rss) - rss[0] < 2,
            note=f"first {rss[0]:.1f} MiB, last {rss[-1]:.1f} MiB, max {max(rss):.1f} MiB over {len(rss)} samples"),
    ]


# -- telemetry ------------------------------------------------------------------------------


def _smi_of(pid: int) -> int | None:
    """The watchdog's nvidia-smi loop (its child)."""
    for child in children(pid):
        try:
            if b"nvidia-smi" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        except OSError:
            pass
    return None


def _idle_runs(site: Site, seconds: float) -> dict[str, float]:
    """CPU seconds over `seconds` of two watchdogs (8 GPUs sampled / none) and of the nvidia-smi stand-in."""
    cmd = "fake-train --mode perf --interval 1 --duration 3600 --gpus 0,1,2,3,4,5,6,7"
    watch = {"throughput": {"pattern": r"tok/s (\d+)"}}
    pb8 = site.playbook("idle8", cmd, ct=200, gpus=tuple(range(8)), watch=watch)
    pb0 = site.playbook("idle0", cmd, ct=201, gpus=(), watch=watch)
    d8, d0 = site.run_dir(site.launch_detached(pb8), 200), site.run_dir(site.launch_detached(pb0), 201)
    w8, w0 = wait_watching(d8), wait_watching(d0)
    smi = wait_for(lambda: _smi_of(w8), 30, "the watchdog's nvidia-smi loop")
    time.sleep(2)  # past the start-up of both
    pids = {"wd8": w8, "wd0": w0, "smi": smi}
    before, t0 = {k: cpu_times(p) or (0.0, 0.0) for k, p in pids.items()}, time.time()
    samples0 = _lines(d8 / "samples.jsonl")
    time.sleep(seconds)
    after, wall = {k: cpu_times(p) or (0.0, 0.0) for k, p in pids.items()}, time.time() - t0
    out = {k: (after[k][0] - before[k][0]) / wall for k in pids}
    out.update({k + "_kids": (after[k][1] - before[k][1]) / wall for k in ("wd8", "wd0")})
    out["samples"] = _lines(d8 / "samples.jsonl") - samples0
    out["bytes_per_sample"] = (d8 / "samples.jsonl").stat().st_size / max(1, _lines(d8 / "samples.jsonl"))
    out["wall"] = wall
    for pb in (pb8, pb0):
        site.gpuops("stop", playbook=pb)
    return out


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def simulate(days: int, interval: float = 2.0, gpus: int = 8) -> tuple[list[int], float]:
    """TelemetryLog fed a sample every `interval` s of simulated time for `days` days: the files'
    bytes at the end of each day, and the wall seconds it took."""
    rnd = random.Random(1)
    t0, sizes = 1_796_120_000.0, []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpuops-telemetry-") as d:
        log = TelemetryLog(d)
        per_day = int(86400 / interval)
        for i in range(days * per_day):
            sample = {g: (130000 + rnd.randint(0, 12000), rnd.randint(0, 100)) for g in range(gpus)}
            log.append(t0 + i * interval, sample, throughput=rnd.randint(400000, 520000))  # as the watchdog calls it
            if (i + 1) % per_day == 0:
                sizes.append(sum(p.stat().st_size for p in Path(d).iterdir()))
    return sizes, time.perf_counter() - started


def bench_telemetry(args: Any) -> list[Row]:
    """Row 5: the watchdog's CPU with 8 GPUs sampled every 2 s, and the telemetry files per day."""
    site = Site(Path(tempfile.mkdtemp(prefix="gpuops-bench-")), cts=(200, 201))
    try:
        cpu = _idle_runs(site, args.idle_seconds)
    finally:
        site.close()
    sizes, took = simulate(args.days)
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    return [
        Row(f"watchdog CPU, idle-logging run, 8 GPUs sampled every 2 s ({cpu['wall']:.0f} s)", [100 * cpu["wd8"]], unit="%",
            baseline_name="the same run, no GPUs sampled", baseline=[100 * cpu["wd0"]], target="<= 1% of one core",
            met=cpu["wd8"] <= 0.01,
            note=f"{cpu['samples']} samples ({cpu['bytes_per_sample']:.0f} bytes each in samples.jsonl); "
                 f"the commands the watchdogs ran and reaped {100 * cpu['wd8_kids']:.1f}% "
                 f"/ {100 * cpu['wd0_kids']:.1f}% more; the nvidia-smi "
                 f"stand-in (Python, re-reading its JSON files each loop; not what the real tool costs) "
                 f"{100 * cpu['smi']:.2f}% of one core"),
        Row("telemetry files after 1 simulated day (8 GPUs, 2 s; TelemetryLog, simulated clock)", [sizes[0] / 1e6],
            unit="MB", target="<= 1 MB/day", met=sizes[0] <= 1e6,
            note=f"after {len(sizes)} days {sizes[-1] / 1e6:.2f} MB; each further day adds "
                 f"{statistics.median(growth) / 1e6 if growth else 0:.2f} MB (coarse 60 s buckets; the last hour raw); "
                 f"{len(sizes)} days simulated in {took:.1f} s"),
    ]
