"""Every gpuops benchmark on the real-sshd bench, each beside its baseline measured in the same run.

    python3 benchmarks/run.py                 # all of them (about 14 minutes on 2 cores)
    python3 benchmarks/run.py startup status  # some of them: startup status abort follow scan
                                              #   wd-abort wd-abort-metrics wd-cpu wd-kill guard telemetry faults compile-guard
                                              #   wd-idle wd-idle-metrics wd-latency first-contact
    python3 benchmarks/run.py --scan-mb 1024 --abort-runs 20
    python3 benchmarks/run.py --venv          # gpuops from a clean venv, installed as users install it

The watchdog's rows are in bench_watchdog.py (abort with nobody attached, SIGKILLed around the
race), bench_wdcost.py (CPU and memory at 20 MB/s, telemetry) and bench_guard.py (the regex budget).

Prints one table: median, p95, max, the baseline's median, the ratio and the target.
Benchmarks print figures; they do not pass or fail (the 'met' column is information).
Only 127.0.0.1 is ever contacted (the bench's own sshd instances).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from benchkit import GPUOPS, ROOT, Row, pct, timed
from benchkit import servers as _servers
from benchkit import stop as _stop

from bench import FakeProxmox, SshServer  # noqa: E402
from bench.inventory import write_inventory  # noqa: E402
from bench_compile_guard import bench_compile_guard
from bench_faults import bench_faults
from bench_guard import bench_guard
from bench_idle import bench_first_contact, bench_wd_idle, bench_wd_idle_metrics, bench_wd_latency
from bench_ssh import bench_status
from bench_watchdog import bench_wd_abort, bench_wd_abort_metrics, bench_wd_kill
from bench_wdcost import bench_telemetry, bench_wd_cpu

PY = sys.executable
VENV = ROOT / "benchmarks" / "out" / "venv"


def use_clean_venv() -> None:
    """Measure gpuops as `pip install .` leaves it in a fresh venv: no editable-install finder,
    no .pth files of this machine's site-packages (here they add ~30 ms to every start)."""
    global PY
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(ROOT)],
                   check=True, capture_output=True)
    subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", str(ROOT)], check=True, capture_output=True)
    PY = str(VENV / "bin" / "python")
    GPUOPS[:] = [str(VENV / "bin" / "gpuops")]


FX_SAMPLE = ROOT / "tests" / "data" / "logs" / "fx_race_thread.txt"


# -- start-up -----------------------------------------------------------------------------


def bench_startup(args: argparse.Namespace) -> list[Row]:
    runs = args.runs
    click = timed([PY, "-c", "import click"], runs)
    helpv = timed(GPUOPS + ["--help"], runs)
    valid = timed(GPUOPS + ["validate", "-i", str(ROOT / "inventories/example.yaml"), "-p", str(ROOT / "playbooks/dflash.yaml")], runs)
    base = statistics.median(click)
    return [
        Row("start-up: gpuops --help", helpv, baseline_name="python -c 'import click'", baseline=click,
            target="<= 80 ms", met=statistics.median(helpv) <= 0.080),
        Row("start-up: gpuops validate", valid, baseline_name="python -c 'import click'", baseline=click,
            target="<= 100 ms", met=statistics.median(valid) <= 0.100, note=f"click alone {base * 1000:.0f} ms"),
    ]


# -- abort latency -----------------------------------------------------------------------


def _playbook(path: Path, command: str, *, stall: int = 0, warmup: bool = False) -> None:
    text = (
        "name: bench\ntarget: ct200\n"
        + ("warmup: {gpus: [5, 6, 7], command: 'fake-warmup --gpu {gpu} --duration 0.2'}\n" if warmup else "")
        + f"launch:\n  session: bench\n  command: {json.dumps(command)}\n"
        f"watch: {{stall_timeout: {stall}}}\nabort: {{signal: INT, grace: 5}}\n"
    )
    path.write_text(text)


def bench_abort(args: argparse.Namespace) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-"))
    ((s, fake),) = _servers(1, (200,))
    try:
        write_inventory(tmp / "inv.yaml", s)
        # The trainer stamps the moment it writes the FX traceback, then keeps running (eager fallback).
        cmd = (f"sleep 0.5; python3 -c 'import time; print(repr(time.time()))' > \"$GPUOPS_RUN_DIR/fx_at\"; "
               f"cat {FX_SAMPLE}; exec sleep 600")
        _playbook(tmp / "pb.yaml", cmd)
        lat, base, by = [], [], []
        conns_launch = ""
        for i in range(args.abort_runs):
            before = s.connection_count()
            r = subprocess.run(GPUOPS + ["launch", "--json", "-v", "-i", str(tmp / "inv.yaml"), "-p", str(tmp / "pb.yaml")],
                               capture_output=True, text=True, timeout=120)
            events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
            run = events[-1].get("run")
            aborted = next((e for e in events if e["event"] == "aborted"), None)
            if aborted is None:
                raise RuntimeError(f"launch exited {r.returncode} without an abort: {r.stdout[-600:]} {r.stderr[-600:]}")
            fx_at = float((Path(fake.home(200)) / ".gpuops" / "runs" / run / "fx_at").read_text())
            lat.append(aborted["session_gone_at"] - fx_at)
            by.append(str(aborted.get("by")))
            if i == 0:
                conns_launch = f"{r.stderr.strip().splitlines()[-1]}; sshd saw {s.connection_count() - before} connection(s)"
            base.append(_naive_abort(s, fake, tmp))
        med = statistics.median(lat)
        return [Row(f"abort latency: FX traceback -> session gone ({len(lat)} runs)", lat,
                    baseline_name="ssh 'tail -F | grep -m1' then ssh 'tmux kill-session'", baseline=base,
                    target="median <= 0.3 s, max <= 1 s", met=med <= 0.3 and max(lat) <= 1.0,
                    note=f"launch: {conns_launch}; abort.json by: {({w: by.count(w) for w in sorted(set(by))})}")]
    finally:
        _stop([(s, fake)])


def _naive_abort(s: SshServer, fake: FakeProxmox, tmp: Path) -> float:
    """The obvious alternative: follow with tail -F | grep -m1 over ssh, then kill the session over ssh."""
    home = Path(fake.home(200))
    log = home / "naive.log"
    log.write_text("")
    stamp = home / "naive_at"
    fake.tmux(200, "new-session", "-d", "-s", "naive", f"sleep 0.5; python3 -c 'import time; print(repr(time.time()))' > {stamp}; cat {FX_SAMPLE} >> {log}; exec sleep 600")
    follow = s.ssh_argv() + [f"pct exec 200 -- bash -c 'tail -n +1 -F {log} | grep -m1 -E \"^RuntimeError: Detected that you are using FX\"'"]
    subprocess.run(follow, capture_output=True, timeout=60)
    subprocess.run(s.ssh_argv() + ["pct exec 200 -- tmux kill-session -t naive"], capture_output=True, timeout=60)
    gone = time.time()
    return gone - float(stamp.read_text())


# -- follow throughput --------------------------------------------------------------------

WRITER = r"""
import sys, time
rate, secs = float(sys.argv[1]), float(sys.argv[2])
pad = "x" * 180
start = time.time(); written = 0; n = 0
out = sys.stdout
while time.time() - start < secs:
    now = time.time()
    while written < (now - start) * rate:
        line = "%.6f %09d %s\n" % (time.time(), n, pad)
        out.write(line); written += len(line); n += 1
    out.flush()
    time.sleep(0.01)
"""


def bench_follow(args: argparse.Namespace) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-"))
    ((s, fake),) = _servers(1, (200,))
    try:
        write_inventory(tmp / "inv.yaml", s)
        writer = tmp / "writer.py"
        writer.write_text(WRITER)
        rate, secs = 20e6, args.follow_seconds
        _playbook(tmp / "pb.yaml", f"python3 {writer} {rate} {secs}")
        subprocess.run(GPUOPS + ["launch", "--detach", "-i", str(tmp / "inv.yaml"), "-p", str(tmp / "pb.yaml")],
                       check=True, capture_output=True, timeout=60)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(GPUOPS + ["logs", "-f", "-i", str(tmp / "inv.yaml"), "-p", str(tmp / "pb.yaml")],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        lags: list[float] = []
        total = 0
        started = time.time()
        pending = b""
        while True:
            chunk = proc.stdout.read1(1 << 20)
            if not chunk:
                break
            total += len(chunk)
            pending += chunk
            cut = pending.rfind(b"\n")
            if cut < 0:
                continue
            last = pending[:cut].rsplit(b"\n", 1)[-1]
            pending = pending[cut + 1 :]
            try:
                lags.append(time.time() - float(last.split(b" ", 1)[0]))
            except ValueError:
                pass
        proc.wait()
        wall = time.time() - started
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (used.ru_utime - before.ru_utime) + (used.ru_stime - before.ru_stime)
        mbs = total / wall / 1e6
        return [Row("follow: 20 MB/s trainer, lag of the newest line", lags,
                    target="lag < 1 s, keeps up", met=max(lags) < 1.0,
                    note=f"{total / 1e6:.0f} MB in {wall:.1f}s ({mbs:.1f} MB/s); gpuops client CPU {cpu:.2f}s ({100 * cpu / wall:.0f}% of one core)")]
    finally:
        _stop([(s, fake)])


# -- scan throughput ----------------------------------------------------------------------


def bench_scan(args: argparse.Namespace) -> list[Row]:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_scan.py"), "--size-mb", str(args.scan_mb), "--json"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-800:])
    data = json.loads(r.stdout.strip().splitlines()[-1])
    grep = [data["grep_mb_s"]]
    rows = [Row(f"scan: stdlib matcher over a {args.scan_mb} MB log", [data["stdlib_mb_s"]], unit="MB/s",
                baseline_name="grep -E -c, same patterns", baseline=grep,
                target=">= 0.5x grep, flat memory", met=data["stdlib_mb_s"] / data["grep_mb_s"] >= 0.5,
                note=f"peak RSS {data['peak_rss_mb']:.0f} MB (same for a 32 MB log)")]
    if data.get("hyperscan_mb_s"):
        rows.append(Row(f"scan: matcher + hyperscan ([fast] extra) over a {args.scan_mb} MB log", [data["hyperscan_mb_s"]],
                        unit="MB/s", baseline_name="grep -E -c, same patterns", baseline=grep,
                        target=">= 0.5x grep, flat memory", met=data["hyperscan_mb_s"] / data["grep_mb_s"] >= 0.5))
    return rows


BENCHES: dict[str, Callable[[argparse.Namespace], list[Row]]] = {
    "startup": bench_startup,
    "status": bench_status,
    "abort": bench_abort,
    "follow": bench_follow,
    "scan": bench_scan,
    "wd-abort": bench_wd_abort,
    "wd-abort-metrics": bench_wd_abort_metrics,
    "wd-cpu": bench_wd_cpu,
    "wd-kill": bench_wd_kill,
    "guard": bench_guard,
    "compile-guard": bench_compile_guard,
    "telemetry": bench_telemetry,
    "faults": bench_faults,
    "wd-idle": bench_wd_idle,
    "wd-idle-metrics": bench_wd_idle_metrics,
    "wd-latency": bench_wd_latency,
    "first-contact": bench_first_contact,
}


def fmt(v: float, unit: str) -> str:
    """A figure in its unit: seconds as ms, shares as percent of one core."""
    if unit == "s":
        return f"{v * 1000:.0f} ms"
    if unit == "%":
        return f"{v:.2g}%" if v < 1 else f"{v:.1f}%"
    if unit == "count":
        return f"{v:.0f}"
    return f"{v:.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"


def print_table(rows: list[Row]) -> None:
    head = ["benchmark", "median", "p95", "max", "baseline", "baseline median", "ratio", "target", "met"]
    body = []
    for r in rows:
        med = statistics.median(r.values)
        bmed = statistics.median(r.baseline) if r.baseline else None
        body.append([
            r.name, fmt(med, r.unit), fmt(pct(r.values, 0.95), r.unit), fmt(max(r.values), r.unit),
            r.baseline_name or "-", fmt(bmed, r.unit) if bmed is not None else "-",
            f"{med / bmed:.2f}" if bmed else "-", r.target, {True: "yes", False: "NO", None: "-"}[r.met],
        ])
    widths = [max(len(str(x[i])) for x in [head] + body) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for cells in body:
        print(line(cells))
    for r in rows:
        if r.note:
            print(f"  {r.name}: {r.note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("which", nargs="*", choices=[[], *BENCHES], help="benchmarks to run (default: all)")
    ap.add_argument("--runs", type=int, default=15, help="repetitions for start-up and status")
    ap.add_argument("--abort-runs", type=int, default=20)
    ap.add_argument("--follow-seconds", type=float, default=5.0)
    ap.add_argument("--scan-mb", type=int, default=1024)
    ap.add_argument("--kill-runs", type=int, default=10, help="wd-kill: runs, each with its watchdog SIGKILLed once")
    ap.add_argument("--wd-mb", type=int, default=1000, help="wd-cpu: MB of log written at 20 MB/s")
    ap.add_argument("--guard-mb", type=int, default=256, help="guard: MiB of the scanned log")
    ap.add_argument("--idle-seconds", type=float, default=60.0, help="telemetry: seconds the idle run is measured")
    ap.add_argument("--idle-cpu-seconds", type=float, default=60.0, help="wd-idle: seconds the idle watchdog is measured")
    ap.add_argument("--days", type=int, default=3, help="telemetry: simulated days of samples")
    ap.add_argument("--seed", type=int, default=1, help="wd-kill: seed of the random race moments")
    ap.add_argument("--venv", action="store_true", help="run gpuops from a clean venv (benchmarks/out/venv), as users install it")
    args = ap.parse_args()
    os.environ.pop("TMUX", None)
    if args.venv:
        use_clean_venv()
    rows: list[Row] = []
    for name in args.which or list(BENCHES):
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += BENCHES[name](args)
    print(f"\ngpuops benchmarks, {time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
          f"python {sys.version.split()[0]}, gpuops from {GPUOPS[0]}\n")
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
