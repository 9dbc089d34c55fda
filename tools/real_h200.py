"""gpuops against a real NVIDIA GPU and real PyTorch, through its real path: `gpuops launch` over SSH (a
real sshd, the test bench's) and `pct exec` (the bench's stand-in) into a fake CT 200 whose processes
are real: the REAL nvidia-smi, the REAL python3 with torch, the watchdog beside the run.

    python3 tools/real_h200.py OUTDIR [CASE ...]      (cases: baseline eager eager-race compile detach deadlock
                                                       guard guard-module restart guard-cost)

Run on the GPU machine after tools/device_setup.sh. Each case leaves OUTDIR/<case>/: gpuops' JSON
events, the run directory's records (events.jsonl, abort.json, profile.json, samples, the log).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bench import FakeProxmox, SshServer, wait_until, write_inventory  # noqa: E402

PY = sys.executable
CT = 200
WARM_CACHE = "/tmp/gpuops-real-inductor-warm"
DRAFTER = f"{PY} {ROOT / 'tools' / 'real_drafter.py'}"
FAST_WATCH = {"sample_interval": 1, "stall_timeout": 300,
              "throughput": {"pattern": r"tok/s (\d+)", "settle": 15, "window": 10},
              "gpu_memory": {"settle": 15, "window": 10}}


def container_path(work: Path) -> str:
    """The CT's PATH: the real python3 (torch) and nvidia-smi first, no stand-in of them."""
    only = work / "ct-bin"
    only.mkdir(exist_ok=True)
    for tool in ("tmux", "flock", "bash"):
        found = shutil.which(tool)
        if found and not (only / tool).exists():
            (only / tool).symlink_to(found)
    smi = shutil.which("nvidia-smi") or "/usr/bin/nvidia-smi"
    return os.pathsep.join([str(only), str(Path(PY).parent), str(Path(smi).parent), "/usr/local/bin", "/usr/bin", "/bin"])


#: What the GPU machine's own environment gives its programs and a container with the GPU passed
#: through would have too (the driver's libraries; NVLink multicast kept off, as KINDS.md asks).
PASSED = ("LD_LIBRARY_PATH", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NCCL_NVLS_ENABLE",
          "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def passed_env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASSED if os.environ.get(k)}


def case_smoke(work: Path, inv: Path, fake: FakeProxmox) -> None:
    """The real tools answer as gpuops expects: nvidia-smi's loop mode, its refusals, torch on the GPU."""
    facts = work / "smoke"
    facts.mkdir(exist_ok=True)
    said = []
    for argv in (["nvidia-smi", "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits", "-lms", "500"],
                 ["nvidia-smi", "--query-gpu=index,memory.used", "--query-compute-apps=pid", "--format=csv"],
                 ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader", "-lms", "0"]):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=2.2)
            said.append(f"$ {' '.join(argv)}\n{r.stdout}{r.stderr}## exit {r.returncode}")
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            said.append(f"$ {' '.join(argv)}\n{out}## still running after 2.2 s")
    (facts / "nvidia-smi.txt").write_text("\n\n".join(said) + "\n")
    print("\n\n".join(said), flush=True)
    pb = playbook(work, "smoke", "smoke", "--shapes 256 --seconds 6 --threads 1", warm="256",
                  throughput={**FAST_WATCH["throughput"], "settle": 2, "window": 2})
    run(work, inv, fake, "smoke", pb, "launch", "--json", "--yes")


def knobs(work: Path, name: str, train: str) -> str:
    """The drafter's options in a file that one command line of playbook `name` reads: a baseline is a run
    with the same command and env, and the eager fallback comes without a change of command."""
    path = work / f"{name}.knobs"
    path.write_text(train + "\n")
    return str(path)


def playbook(work: Path, case: str, name: str, train: str, *, warm: str | None = "2048", env: dict | None = None,
             launch: dict | None = None, restart: dict | None = None, **watch: object) -> Path:
    data: dict = {
        "name": name,
        "target": "ct200",
        "workdir": str(ROOT),
        "env": {"TORCHINDUCTOR_CACHE_DIR": WARM_CACHE, "PYTHONUNBUFFERED": "1", **(env or {})},
        "preflight": {"gpus": [0], "max_memory_used_mib": 2000},
        "launch": {"session": f"real-{case}", "command": f"{DRAFTER} train $(cat {shlex.quote(knobs(work, name, train))})",
                   **(launch or {})},
        "watch": {**FAST_WATCH, **watch},
        "abort": {"signal": "INT", "grace": 15},
    }
    if restart:
        data["restart"] = restart
    if warm:
        data["warmup"] = {"gpus": [0], "command": f"{DRAFTER} warmup --shapes {warm}", "timeout": 600}
    path = work / f"{case}.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def gpuops(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([PY, "-m", "gpuops", *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def keep(fake: FakeProxmox, session: str, dest: Path, result: subprocess.CompletedProcess | None, started: float) -> None:
    """What the case left: gpuops' output and the run directory's records."""
    dest.mkdir(parents=True, exist_ok=True)
    if result is not None:
        (dest / "gpuops.jsonl").write_text(result.stdout)
        (dest / "gpuops.err").write_text(result.stderr + f"\n## exit {result.returncode} after {time.time() - started:.1f}s\n")
    state = fake.home(CT) / ".gpuops"
    run = (state / "sessions" / session).read_text().strip() if (state / "sessions" / session).exists() else None
    if run:
        src = state / "runs" / run
        for item in src.iterdir():
            if item.is_file() and item.name not in ("env.sh",):
                shutil.copy(item, dest / item.name)
            elif item.is_dir():  # earlier attempts' records
                shutil.copytree(item, dest / item.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("env.sh"))


def case_baseline(work: Path, inv: Path, fake: FakeProxmox) -> None:
    shutil.rmtree(WARM_CACHE, ignore_errors=True)
    pb = playbook(work, "baseline", "dflash-real", "--shapes 2048 --seconds 45")
    run(work, inv, fake, "baseline", pb, "launch", "--json", "--yes")


def case_eager(work: Path, inv: Path, fake: FakeProxmox) -> None:
    # The race that kills threads is reported, not acted on, so the quiet detectors are what stops it.
    pb = playbook(work, "eager", "dflash-real", "--eager --shapes 2048 --seconds 90",
                  builtin_rules={"fx-patcher-race": "warn"},
                  throughput={**FAST_WATCH["throughput"], "action": "abort"})
    run(work, inv, fake, "eager", pb, "launch", "--json", "--yes")


def case_eager_race(work: Path, inv: Path, fake: FakeProxmox) -> None:
    pb = playbook(work, "eager-race", "dflash-real", "--eager --shapes 2048 --seconds 90")
    run(work, inv, fake, "eager-race", pb, "launch", "--json", "--yes")


def case_compile(work: Path, inv: Path, fake: FakeProxmox) -> None:
    pb = playbook(work, "compile", "dflash-real", "--shapes 1024,2048,4096 --seconds 45", recompiles=True,
                  compile_after_warmup={"settle": 10})
    run(work, inv, fake, "compile", pb, "launch", "--json", "--yes")


def case_detach(work: Path, inv: Path, fake: FakeProxmox) -> None:
    pb = playbook(work, "detach", "dflash-race", "--shapes 2048 --seconds 120 --fx-race 10 --shared")
    started = time.time()
    first = gpuops("launch", "--detach", "--json", "--yes", "-i", str(inv), "-p", str(pb))
    session = "real-detach"
    wait_until(lambda: fake.tmux(CT, "has-session", "-t", f"={session}").returncode != 0, timeout=300,
               message="the watchdog to stop the detached run")
    gone = time.time()
    after = gpuops("logs", "-f", "--json", "-i", str(inv), "-p", str(pb))
    keep(fake, session, work / "detach", after, started)
    (work / "detach" / "launch.jsonl").write_text(first.stdout + first.stderr)
    (work / "detach" / "timing.txt").write_text(f"detached at {started:.3f}; session gone at {gone:.3f}; "
                                                f"logs -f exit {after.returncode}\n")


def case_deadlock(work: Path, inv: Path, fake: FakeProxmox) -> None:
    cold = f"/tmp/gpuops-real-inductor-cold-{os.getpid()}"
    pb = playbook(work, "deadlock", "dflash-cold", "--shapes 2048 --threads 3 --seconds 400 --hang-dump 150", warm=None,
                  env={"TORCHINDUCTOR_CACHE_DIR": cold}, stall_timeout="auto",
                  stall_auto={"initial": 60, "settle": 30, "floor": 20}, gpu_memory=False)
    run(work, inv, fake, "deadlock", pb, "launch", "--json", "--yes")


def _cold(case: str) -> str:
    """An empty inductor (and triton) cache of the case's own: every compile happens during the run."""
    cold = f"/tmp/gpuops-real-inductor-cold-{case}-{os.getpid()}"
    shutil.rmtree(cold, ignore_errors=True)
    return cold


COLD_THREE = "--shapes 2048 --threads 3 --steps 5 --seconds 400 --hang-dump 150"
COLD_WATCH = {"stall_timeout": "auto", "stall_auto": {"initial": 60, "settle": 30, "floor": 20}, "gpu_memory": False}


def detached(work: Path, inv: Path, fake: FakeProxmox, case: str, pb: Path) -> None:
    """`launch --detach`, nobody attached; status polled while it runs (the guard's counts), then `logs -f` to its end."""
    started = time.time()
    first = gpuops("launch", "--detach", "--json", "--yes", "-i", str(inv), "-p", str(pb))
    session = f"real-{case}"
    seen: list[str] = []

    def ended() -> bool:
        seen.append(gpuops("status", "--json", "-i", str(inv), "-p", str(pb)).stdout)
        return fake.tmux(CT, "has-session", "-t", f"={session}").returncode != 0

    wait_until(ended, timeout=600, interval=3.0, message=f"the detached {case} run to end")
    after = gpuops("logs", "-f", "--json", "-i", str(inv), "-p", str(pb))
    keep(fake, session, work / case, after, started)
    (work / case / "launch.jsonl").write_text(first.stdout + first.stderr)
    (work / case / "status.jsonl").write_text("".join(seen))
    summary = after.stdout.strip().splitlines()[-1] if after.stdout.strip() else after.stderr[-500:]
    print(f"## {case}: detached, logs -f exit {after.returncode} after {time.time() - started:.0f}s: {summary[:600]}",
          flush=True)


def case_guard(work: Path, inv: Path, fake: FakeProxmox) -> None:
    """The deadlock case's workload (cold caches, three threads first-calling their own compiled
    flex_attention fwd+bwd at once), with `launch.compile_guard: true`: it must complete."""
    cold = _cold("guard")
    pb = playbook(work, "guard", "dflash-guard", COLD_THREE, warm=None,
                  env={"TORCHINDUCTOR_CACHE_DIR": cold, "TRITON_CACHE_DIR": cold + "/triton"},
                  launch={"compile_guard": True}, **COLD_WATCH)
    detached(work, inv, fake, "guard", pb)


def case_guard_module(work: Path, inv: Path, fake: FakeProxmox) -> None:
    """Three threads each training their own nn.Module.compile()d block (Linear + flex_attention, SGD), cold."""
    cold = _cold("module")
    pb = playbook(work, "guard-module", "dflash-module", "--module --threads 3 --steps 20 --seconds 400 --hang-dump 150",
                  warm=None, env={"TORCHINDUCTOR_CACHE_DIR": cold, "TRITON_CACHE_DIR": cold + "/triton"},
                  launch={"compile_guard": True}, **COLD_WATCH)
    run(work, inv, fake, "guard-module", pb, "launch", "--json", "--yes")


def case_guard_module_variants(work: Path, inv: Path, fake: FakeProxmox) -> None:
    """The module case again, with the stacks dumped at 40 s (where it hangs), and through torch.compile(module)."""
    for case, api in (("module-dump", "method"), ("module-fn", "function")):
        cold = _cold(case)
        pb = playbook(work, case, "dflash-" + case,
                      f"--module --module-api {api} --threads 3 --steps 20 --seconds 400 --hang-dump 40",
                      warm=None, env={"TORCHINDUCTOR_CACHE_DIR": cold, "TRITON_CACHE_DIR": cold + "/triton"},
                      launch={"compile_guard": True}, stall_timeout=55)
        run(work, inv, fake, case, pb, "launch", "--json", "--yes")


def case_restart(work: Path, inv: Path, fake: FakeProxmox) -> None:
    """The same cold three-thread run WITHOUT the guard: stopped (stall), then restarted by the watchdog with
    the guard, nobody attached, and completed."""
    cold = _cold("restart")
    pb = playbook(work, "restart", "dflash-restart", COLD_THREE, warm=None,
                  env={"TORCHINDUCTOR_CACHE_DIR": cold, "TRITON_CACHE_DIR": cold + "/triton"},
                  restart={"max": 2, "on": ["stall", "fx-tracing-race", "fx-patcher-race"], "compile_guard": True,
                           "delay": 2},
                  **COLD_WATCH)
    detached(work, inv, fake, "restart", pb)


def case_guard_cost(work: Path, inv: Path, fake: FakeProxmox) -> None:
    """The guard's cost per cached call of a compiled function, against the bare compiled call, on this GPU."""
    said = []
    for device in ("cuda", "cpu"):
        r = subprocess.run([PY, str(ROOT / "benchmarks" / "bench_compile_guard.py"), "--torch", "real", "--device", device,
                            "--rounds", "31"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        said.append(f"## --device {device}\n{r.stdout}{r.stderr[-2000:]}## exit {r.returncode}\n")
    (work / "guard-cost.txt").write_text("".join(said))
    print("".join(said), flush=True)


def run(work: Path, inv: Path, fake: FakeProxmox, case: str, pb: Path, *args: str) -> None:
    started = time.time()
    result = gpuops(*args, "-i", str(inv), "-p", str(pb))
    keep(fake, f"real-{case}", work / case, result, started)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    print(f"## {case}: exit {result.returncode} in {time.time() - started:.0f}s: {summary[:600]}", flush=True)


CASES = {"smoke": case_smoke, "baseline": case_baseline, "eager": case_eager, "eager-race": case_eager_race, "compile": case_compile,
         "detach": case_detach, "deadlock": case_deadlock, "guard": case_guard, "guard-module": case_guard_module,
         "guard-module-variants": case_guard_module_variants,
         "restart": case_restart, "guard-cost": case_guard_cost}


def _pack(out: Path, work: Path) -> None:
    import tarfile

    with tarfile.open(out / "real_h200.tgz.tmp", "w:gz") as tar:
        tar.add(work, arcname="real_h200", filter=lambda info: None if "ct-bin" in info.name else info)
    os.replace(out / "real_h200.tgz.tmp", out / "real_h200.tgz")


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    names = argv[1:] or list(CASES)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    server = SshServer()
    server.start()
    try:
        fake = FakeProxmox(server.fake_root)
        fake.add_container(CT, gpus=1)
        fake.set_env(CT, PATH=container_path(work), **passed_env())
        inv = write_inventory(work / "inventory.yaml", server, gpus=[0])
        print("## status:", gpuops("status", "-i", str(inv)).stdout[-800:], flush=True)
        for name in names:
            CASES[name](work, inv, fake)
            _pack(out, work)  # after every case: a command cut short still brings back what it saw
    finally:
        server.stop()
        fake.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
