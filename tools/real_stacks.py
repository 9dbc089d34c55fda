"""The stacks of a real hang, and of a live compiled training, on a real GPU through gpuops' real path.

    python3 tools/real_stacks.py OUTDIR [hang] [live]

On the GPU machine after tools/device_setup.sh (export PYTHONPATH=/tmp/site), as tools/real_h200.py:
a real sshd (the test bench's), `pct exec` (the bench's stand-in) into a fake CT 200 whose processes
are real (the real python3 with torch, the real nvidia-smi), `launch --detach`, nobody attached.

- hang: three threads first-calling their own compiled flex_attention (fwd+bwd) on cold inductor and
  triton caches, no compile guard, `stall_timeout: 45`: the watchdog stalls it and takes the stacks
  before the signal (watch.stacks: on_stall); `gpuops logs --stacks --json` prints them afterwards.
- live: one thread training its compiled flex_attention on a warm cache; `gpuops stacks --json` twice
  while it runs, then `logs -f` to its normal end (every step logged).

Each case leaves OUTDIR/stacks/<case>/ (the run directory's records with stacks/, gpuops' output), and
OUTDIR/real_stacks.tgz; copy OUTDIR/stacks/ to tests/data/real_h200/stacks/ (tests/real/test_real_h200_stacks.py).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_h200 as real  # noqa: E402  (its bench, CT, playbook and record keeping)
from bench import FakeProxmox, SshServer, wait_until, write_inventory  # noqa: E402

STALL = 45


def case_hang(work: Path, inv: Path, fake: FakeProxmox) -> None:
    cold = real._cold("stacks-hang")
    pb = real.playbook(work, "stacks-hang", "stacks-hang", "--shapes 2048 --threads 3 --steps 5 --seconds 400",
                       warm=None, env={"TORCHINDUCTOR_CACHE_DIR": cold, "TRITON_CACHE_DIR": cold + "/triton"},
                       stall_timeout=STALL, gpu_memory=False)
    started = time.time()
    first = real.gpuops("launch", "--detach", "--json", "--yes", "-i", str(inv), "-p", str(pb))
    session = "real-stacks-hang"
    wait_until(lambda: fake.tmux(real.CT, "has-session", "-t", f"={session}").returncode != 0, timeout=600,
               interval=2.0, message="the watchdog to stop the hung run")
    after = real.gpuops("logs", "-f", "--json", "-i", str(inv), "-p", str(pb))
    dest = work / "stacks" / "hang"
    real.keep(fake, session, dest, after, started)
    (dest / "launch.jsonl").write_text(first.stdout + first.stderr)
    shown = real.gpuops("logs", "--stacks", "--json", "-i", str(inv), "-p", str(pb))
    (dest / "logs-stacks.jsonl").write_text(shown.stdout)
    (dest / "logs-stacks.txt").write_text(real.gpuops("logs", "--stacks", "-i", str(inv), "-p", str(pb)).stdout)
    print(f"## hang: logs -f exit {after.returncode}, logs --stacks exit {shown.returncode}", flush=True)


def case_live(work: Path, inv: Path, fake: FakeProxmox) -> None:
    pb = real.playbook(work, "stacks-live", "stacks-live", "--shapes 2048 --threads 1 --seconds 40", warm="2048")
    started = time.time()
    first = real.gpuops("launch", "--detach", "--json", "--yes", "-i", str(inv), "-p", str(pb))
    session = "real-stacks-live"
    home = fake.home(real.CT) / ".gpuops"
    run_id = (home / "sessions" / session).read_text().strip()
    log = home / "runs" / run_id / "log"
    wait_until(lambda: log.exists() and log.read_text().count("tok/s") >= 5, timeout=600, interval=1.0,
               message="the compiled training's steps")
    taken = [real.gpuops("stacks", "--json", "-i", str(inv), "-p", str(pb)) for _ in range(2)]
    after = real.gpuops("logs", "-f", "--json", "-i", str(inv), "-p", str(pb))
    dest = work / "stacks" / "live"
    real.keep(fake, session, dest, after, started)
    (dest / "launch.jsonl").write_text(first.stdout + first.stderr)
    (dest / "stacks.jsonl").write_text("".join(t.stdout for t in taken))
    (dest / "stacks.err").write_text("".join(f"{t.stderr}## exit {t.returncode}\n" for t in taken))
    print(f"## live: stacks exits {[t.returncode for t in taken]}, logs -f exit {after.returncode}", flush=True)


CASES = {"hang": case_hang, "live": case_live}


def main(argv: list[str]) -> int:
    import tarfile

    out = Path(argv[0])
    work = out
    work.mkdir(parents=True, exist_ok=True)
    server = SshServer()
    server.start()
    try:
        fake = FakeProxmox(server.fake_root)
        fake.add_container(real.CT, gpus=1)
        fake.set_env(real.CT, PATH=real.container_path(work), **real.passed_env())
        inv = write_inventory(work / "inventory.yaml", server, gpus=[0])
        for name in argv[1:] or list(CASES):
            CASES[name](work, inv, fake)
            with tarfile.open(out / "real_stacks.tgz.tmp", "w:gz") as tar:
                tar.add(work / "stacks", arcname="stacks")
            os.replace(out / "real_stacks.tgz.tmp", out / "real_stacks.tgz")
    finally:
        server.stop()
        fake.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
