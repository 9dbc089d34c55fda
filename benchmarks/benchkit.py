"""What every benchmark shares: the table's rows, timing, the bench's sshd + fake Proxmox sites, and
a process's CPU and memory as /proc says (the watchdog is not our child: rusage cannot see it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from bench import TEST_AREAS, FakeProxmox, SshServer  # noqa: E402
from bench.inventory import write_inventory  # noqa: E402

sys.path.extend(str(area) for area in TEST_AREAS)  # the test modules the fault matrix's rows import, by name

_BIN = Path(sys.executable).parent / "gpuops"
#: How gpuops is run; replaced in place by run.py --venv (every module sees the same list).
GPUOPS: list[str] = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "gpuops"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    """One line of the table: a figure's values beside its baseline's, its target and whether it was met."""

    name: str
    values: list[float]
    unit: str = "s"
    baseline_name: str = ""
    baseline: list[float] | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""


def pct(values: list[float], q: float) -> float:
    """The q-quantile of values (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def timed(argv: list[str], runs: int, *, env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> list[float]:
    """Wall seconds of each of `runs` runs of argv; a run exiting outside `ok` is an error."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, env=env)
        out.append(time.perf_counter() - t0)
        if r.returncode not in ok:
            raise RuntimeError(f"{argv[:4]} exited {r.returncode}: {r.stderr.decode()[-500:]}")
    return out


def servers(n: int, cts: tuple[int, ...]) -> list[tuple[SshServer, FakeProxmox]]:
    """n started sshd on 127.0.0.1, each a fake Proxmox host with containers `cts` (8 GPUs each)."""
    out = []
    for _ in range(n):
        s = SshServer()
        s.start()
        fake = FakeProxmox(s.fake_root)
        for ct in cts:
            fake.add_container(ct)
        out.append((s, fake))
    return out


def stop(pairs: list[tuple[SshServer, FakeProxmox]]) -> None:
    """Stop the sshd and sweep what their fake hosts left (processes, files)."""
    for s, fake in pairs:
        s.stop()
        fake.cleanup()


# -- a process seen from outside ------------------------------------------------------------


def cpu_times(pid: int) -> tuple[float, float] | None:
    """(utime + stime, cutime + cstime) of a live process: its own CPU seconds, and those of the
    children it has waited for (a tmux or nvidia-smi it ran); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK, (int(fields[13]) + int(fields[14])) / CLK_TCK


def run_seconds(pid: int) -> float | None:
    """CPU seconds of a live process to the nanosecond (/proc/<pid>/schedstat: the scheduler's own
    count), where utime + stime are sampled at each clock tick (10 ms: a process that uses 0.2% of a
    core is charged 6 ticks or 8 in 30 s); ticks where there is no schedstat, None once it is gone."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            return int(fh.read().split()[0]) / 1e9
    except FileNotFoundError:
        times = cpu_times(pid)
        return None if times is None else times[0]
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process (/proc/<pid>/stat), None once it is gone."""
    times = cpu_times(pid)
    return None if times is None else times[0]


def rss_mib(pid: int) -> float | None:
    """VmRSS of a live process in MiB, None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def children(pid: int) -> list[int]:
    """The direct children of a process (every thread's list)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return out


# -- a site: one sshd, its fake Proxmox host, a target per container ----------------------------


class Site:
    """An sshd + fake Proxmox host with containers, an inventory (target ctN per CT) and playbooks."""

    def __init__(self, tmp: Path, cts: tuple[int, ...] = (200,)) -> None:
        self.tmp, self.cts = tmp, cts
        ((self.sshd, self.fake),) = servers(1, cts)
        extra = {f"ct{ct}": {"host": "pve1", "ctid": ct, "gpus": list(range(8))} for ct in cts[1:]}
        self.inventory = write_inventory(tmp / "inv.yaml", self.sshd, ctid=cts[0], target=f"ct{cts[0]}",
                                         extra_targets=extra)

    def close(self) -> None:
        stop([(self.sshd, self.fake)])

    def playbook(self, name: str, command: str, *, ct: int = 200, gpus: tuple[int, ...] = (5, 6),
                 rules: list[dict[str, str]] | None = None, grace: float = 5, watch: dict[str, Any] | None = None) -> Path:
        """A playbook running `command` in session `bench` on CT `ct`, its GPUs `gpus` checked and sampled
        (none: no preflight section, nothing sampled); `watch` adds keys to its watch section."""
        section = {"stall_timeout": 0, "rules": rules or [], **(watch or {})}
        preflight = f"preflight: {{gpus: {list(gpus)}}}\n" if gpus else ""
        text = (f"name: {name}\ntarget: ct{ct}\n{preflight}"
                f"launch:\n  session: bench\n  command: {json.dumps(command)}\n"
                f"watch: {json.dumps(section)}\nabort: {{signal: INT, grace: {grace}}}\n")
        path = self.tmp / f"{name}.yaml"
        path.write_text(text)
        return path

    def gpuops(self, *args: str, playbook: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`gpuops ARGS -i INVENTORY -p PLAYBOOK`, run to completion."""
        return subprocess.run(GPUOPS + [*args, "-i", str(self.inventory), "-p", str(playbook)],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def launch_detached(self, playbook: Path) -> str:
        """`gpuops launch --detach`; the run's id."""
        r = self.gpuops("launch", "--detach", "--json", playbook=playbook)
        if r.returncode != 0:
            raise RuntimeError(f"launch --detach exited {r.returncode}: {r.stderr[-800:]}")
        events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        return str(events[-1]["run"])

    def run_dir(self, run_id: str, ct: int = 200) -> Path:
        return Path(self.fake.home(ct)) / ".gpuops" / "runs" / run_id

    def gpu_pids(self, ct: int = 200) -> list[str]:
        """Processes holding fake GPU memory in CT `ct` (read from the stand-in's files, no nvidia-smi)."""
        procs = self.fake.gpus(ct).procs_dir
        return [p.name for p in procs.glob("*.json")] if procs.exists() else []

    def session_alive(self, ct: int = 200) -> bool:
        return self.fake.tmux(ct, "has-session", "-t", "=bench").returncode == 0


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll until predicate() is truthy (its value) or raise past the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
