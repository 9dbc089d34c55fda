"""What a detached run's watchdog costs while nothing happens, and how fast it sees a line that matters.

wd-idle: a run logging one line a second with 8 GPUs sampled every 2 s, measured over --idle-cpu-seconds:
the watchdog's own CPU plus what its tools cost (its live nvidia-smi loops; the commands it ran and
reaped), from /proc: schedstat (to the nanosecond) for the live processes, cutime + cstime (clock
ticks, all the kernel keeps) for the reaped ones. Beside it, in the same container
over the same seconds, `tail -F` of the same log (the cheapest thing that follows a log).

wd-latency: a trainer prints a stamped line a rule warns on every 0.3 s; the latency is the match
event's time minus the stamp (both this machine's clock). Beside it, the same run in a second
container whose watchdog is made to poll (GPUOPS_AGENT_NO_INOTIFY=1: the 20 ms poll it had before).
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import Row, Site, children, cpu_times, run_seconds, wait_for

from bench.watchdog import events, heartbeat, wait_watching

STAMPER = ("python3 -u -c \"import time\nfor i in range(LINES):\n    time.sleep(0.3)\n"
           "    print('bench-mark %.6f' % time.time())\ntime.sleep(600)\"")
LINES = 25


def _tree_cpu(pid: int) -> tuple[float, float, float] | None:
    """CPU seconds of a process and of its live children (the nvidia-smi loops), both from schedstat, and
    of the children it reaped (ticks: the kernel keeps no finer count of those)."""
    own, ticks = run_seconds(pid), cpu_times(pid)
    if own is None or ticks is None:
        return None
    return own, ticks[1], sum(run_seconds(c) or 0.0 for c in children(pid))


def bench_wd_idle(args: Any) -> list[Row]:
    site = Site(Path(tempfile.mkdtemp(prefix="gpuops-bench-")))
    try:
        cmd = "fake-train --mode perf --interval 1 --duration 3600 --gpus 0,1,2,3,4,5,6,7"
        pb = site.playbook("idle", cmd, gpus=tuple(range(8)), watch={"sample_interval": 2})
        d = site.run_dir(site.launch_detached(pb))
        pid = wait_watching(d)
        wait_for(lambda: len(children(pid)) >= 2, 30, "the watchdog's two nvidia-smi loops")
        time.sleep(3)  # past the start-up
        tail = subprocess.Popen(["tail", "-F", str(d / "log")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        t0, wd0, tail0 = time.time(), _tree_cpu(pid), run_seconds(tail.pid)
        time.sleep(args.idle_cpu_seconds)
        wall, wd1, tail1 = time.time() - t0, _tree_cpu(pid), run_seconds(tail.pid)
        tail.send_signal(signal.SIGTERM)
        tail.wait()
        beat = heartbeat(d)
        site.gpuops("stop", playbook=pb)
    finally:
        site.close()
    if wd0 is None or wd1 is None or tail0 is None or tail1 is None:
        raise RuntimeError("the watchdog or tail -F ended during the measurement")
    own, reaped, loops = (100 * (b - a) / wall for a, b in zip(wd0, wd1, strict=True))
    wd = own + reaped + loops
    base = 100 * (tail1 - tail0) / wall
    return [Row(f"watchdog CPU idle, 1 line/s, 8 GPUs sampled every 2 s, with its tools ({wall:.0f} s)", [wd], unit="%",
                baseline_name="tail -F of the same log, same seconds", baseline=[base], target="<= 0.25% of one core",
                met=wd <= 0.25, note=f"waiting: {beat.get('wait')}; the watchdog {own:.3f}% and its two nvidia-smi loops (the Python stand-in) "
                                     f"{loops:.3f}% (/proc schedstat), the commands it ran and reaped {reaped:.3f}% (ticks)")]


def bench_wd_idle_metrics(args: Any) -> list[Row]:
    """wd-idle's run with `watch.metrics.textfile` on (the run's *.prom rewritten every sample interval) in CT 200,
    beside the same run without it in CT 201, measured over the same seconds: what the textfile costs."""
    from benchkit import rss_mib

    site = Site(Path(tempfile.mkdtemp(prefix="gpuops-bench-")), cts=(200, 201))
    folder = site.tmp / "textfile"
    folder.mkdir()
    try:
        cmd = "fake-train --mode perf --interval 1 --duration 3600 --gpus 0,1,2,3,4,5,6,7"
        pids, pbs = {}, {}
        for ct, metrics in ((200, {"textfile": str(folder)}), (201, None)):
            watch = {"sample_interval": 2, **({"metrics": metrics} if metrics else {})}
            pbs[ct] = site.playbook(f"idle{ct}", cmd, ct=ct, gpus=tuple(range(8)), watch=watch)
            d = site.run_dir(site.launch_detached(pbs[ct]), ct)
            pids[ct] = wait_watching(d)
            wait_for(lambda ct=ct: len(children(pids[ct])) >= 2, 30, f"CT {ct}'s two nvidia-smi loops")
        wait_for(lambda: any(folder.glob("gpuops-*.prom")), 30, "the run's textfile")
        time.sleep(3)  # past the start-up
        t0, before = time.time(), {ct: _tree_cpu(pid) for ct, pid in pids.items()}
        time.sleep(args.idle_cpu_seconds)
        wall, after = time.time() - t0, {ct: _tree_cpu(pid) for ct, pid in pids.items()}
        rss = {ct: rss_mib(pid) for ct, pid in pids.items()}
        files = sorted(p.name for p in folder.iterdir())
        for pb in pbs.values():
            site.gpuops("stop", playbook=pb)
    finally:
        site.close()
    if any(v is None for v in (*before.values(), *after.values())):
        raise RuntimeError("a watchdog ended during the measurement")
    cpu = {ct: sum(100 * (b - a) / wall for a, b in zip(before[ct], after[ct], strict=True)) for ct in pids}  # type: ignore[arg-type]
    return [Row(f"watchdog CPU idle with watch.metrics.textfile, 1 line/s, 8 GPUs sampled every 2 s ({wall:.0f} s)",
                [cpu[200]], unit="%", baseline_name="the same run without metrics, same seconds", baseline=[cpu[201]],
                target="<= 0.25% of one core", met=cpu[200] <= 0.25,
                note=f"RSS {rss[200]:.1f} MiB with the textfile, {rss[201]:.1f} MiB without; the folder held {files}")]


def _latencies(d: Path) -> list[float]:
    out = []
    for ev in events(d):
        line = str(ev.get("line") or "")
        if ev.get("event") == "match" and ev.get("rule") == "bench-mark" and line.startswith("bench-mark "):
            out.append(float(ev["ts"]) - float(line.split()[1]))
    return out


def bench_wd_latency(args: Any) -> list[Row]:
    site = Site(Path(tempfile.mkdtemp(prefix="gpuops-bench-")), cts=(200, 201))
    try:
        site.fake.set_env(201, GPUOPS_AGENT_NO_INOTIFY="1")
        rules = [{"name": "bench-mark", "pattern": "^bench-mark ", "action": "warn"}]
        cmd = STAMPER.replace("LINES", str(LINES))
        runs = {}
        for ct in (200, 201):
            pb = site.playbook(f"lat{ct}", cmd, ct=ct, gpus=(), rules=rules)
            runs[ct] = (pb, site.run_dir(site.launch_detached(pb), ct))
        for ct, (_, d) in runs.items():
            wait_for(lambda d=d: len(_latencies(d)) >= LINES, 60, f"the {LINES} matches in CT {ct}", interval=0.2)
        ino, poll = _latencies(runs[200][1]), _latencies(runs[201][1])
        modes = (heartbeat(runs[200][1]).get("wait"), heartbeat(runs[201][1]).get("wait"))
        for pb, _ in runs.values():
            site.gpuops("stop", playbook=pb)
    finally:
        site.close()
    med = statistics.median(ino)
    return [Row(f"watchdog log line -> match, detached ({len(ino)} lines)", ino,
                baseline_name="the same, the watchdog polling (GPUOPS_AGENT_NO_INOTIFY=1)", baseline=poll,
                target="median <= 5 ms", met=med <= 0.005, note=f"waiting: {modes[0]} / {modes[1]}")]



def bench_first_contact(args: Any) -> list[Row]:
    """The first `gpuops status` of a gpuops version on a target: its pct calls (counted by a pct first on
    the host's PATH) and its time, beside the second status (the files there)."""
    import shlex
    import sys

    from benchkit import GPUOPS, ROOT, servers, stop

    from bench.inventory import write_inventory

    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-"))
    pairs = servers(1, (200,))
    try:
        s, fake = pairs[0]
        inv = write_inventory(tmp / "inv.yaml", s)
        calls, bindir = tmp / "pct-calls", tmp / "pct-counter"
        bindir.mkdir()
        real = ROOT / "tests" / "standins" / "bin" / "pct"
        (bindir / "pct").write_text(f"#!/bin/bash\nprintf '%s\\n' \"$1\" >> {shlex.quote(str(calls))}\n"
                                    f"exec {shlex.quote(sys.executable)} {shlex.quote(str(real))} \"$@\"\n")
        (bindir / "pct").chmod(0o755)
        with (Path(s.fake_root) / "host" / "home" / ".bashrc").open("a") as fh:
            fh.write(f"export PATH={shlex.quote(str(bindir))}:\"$PATH\"\n")
        t0 = time.perf_counter()
        subprocess.run(GPUOPS + ["status", "-i", str(inv)], capture_output=True, check=True)
        first = time.perf_counter() - t0
        said = calls.read_text().splitlines()
        calls.write_text("")
        t0 = time.perf_counter()
        subprocess.run(GPUOPS + ["status", "-i", str(inv)], capture_output=True, check=True)
        second = time.perf_counter() - t0
        again = calls.read_text().splitlines()
    finally:
        stop(pairs)
    return [Row("first status of a gpuops version on a target: pct exec calls", [float(said.count("exec"))], unit="count",
                baseline_name="the next status (files there)", baseline=[float(again.count("exec"))],
                target="<= 2 pct exec", met=said.count("exec") <= 2,
                note=f"pct calls {said} (the need-lib probe's own pct status after it); the first status took "
                     f"{first * 1000:.0f} ms, the next {second * 1000:.0f} ms")]
