"""`gpuops status` over the user's ssh binary, each beside its baseline in the same run: with gpuops' ControlMaster
warm, the first status (no master: the handshake overlaps gpuops' start-up), 8 targets over 4 hosts, and a
closed port (said at once, no retries). The baseline is one raw `ssh host 'pct exec 200 -- nvidia-smi ...'`."""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchkit import GPUOPS, Row, timed
from benchkit import servers as _servers
from benchkit import stop as _stop

from bench import FakeProxmox, SshServer  # noqa: E402
from bench.inventory import write_inventory  # noqa: E402

QUERY = "nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"


def _multi_inventory(path: Path, servers: list[tuple[SshServer, FakeProxmox]], cts: tuple[int, ...]) -> None:
    lines = ["hosts:"]
    for i, (s, _) in enumerate(servers):
        lines += [f"  pve{i}:", f"    address: {s.host}", f"    port: {s.port}", f"    user: {s.user}",
                  f"    identity_file: {s.client_key}", f"    known_hosts: {s.known_hosts}"]
    lines.append("targets:")
    for i, _ in enumerate(servers):
        for ct in cts:
            lines += [f"  ct{ct}-{i}:", f"    host: pve{i}", f"    ctid: {ct}"]
    path.write_text("\n".join(lines) + "\n")


def _drop_masters(runtime: str) -> None:
    """End gpuops' masters under this XDG_RUNTIME_DIR (the next status makes a new one)."""
    for sock in glob.glob(os.path.join(runtime, "gpuops", "cm", "[0-9a-f]" * 20)):
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True, timeout=10)


def _dead_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_status(args: argparse.Namespace) -> list[Row]:
    runs = args.runs
    tmp = Path(tempfile.mkdtemp(prefix="gpuops-bench-"))
    runtime = tempfile.mkdtemp(prefix="gr-", dir="/tmp")
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    one = _servers(1, (200,))
    four = _servers(4, (200, 201))
    try:
        s, _ = one[0]
        write_inventory(tmp / "one.yaml", s)
        _multi_inventory(tmp / "eight.yaml", four, (200, 201))
        dead = tmp / "dead.yaml"
        dead.write_text((tmp / "one.yaml").read_text().replace(f"port: {s.port}", f"port: {_dead_port()}"))
        status1 = GPUOPS + ["status", "-i", str(tmp / "one.yaml")]
        raw, first, warm, eight, refused = [], [], [], [], []
        for _ in range(runs):  # interleaved, so load changes hit every figure alike
            raw += timed(s.ssh_argv() + [f"pct exec 200 -- {QUERY}"], 1)
            _drop_masters(runtime)
            first += timed(status1, 1, env=env)
            warm += timed(status1, 1, env=env)
            timed(GPUOPS + ["status", "-i", str(tmp / "eight.yaml")], 1, env=env)  # the 4 hosts' masters warm
            eight += timed(GPUOPS + ["status", "-i", str(tmp / "eight.yaml")], 1, env=env)
            refused += timed(GPUOPS + ["status", "-i", str(dead)], 1, env=env, ok=(3,))
        before = s.connection_count()
        verbose = subprocess.run(status1 + ["-v"], capture_output=True, text=True, env=env).stderr.strip().splitlines()
        med = statistics.median
        return [
            Row("status: 1 target, gpuops' master warm", warm, baseline_name="raw ssh 'pct exec 200 -- nvidia-smi ...'",
                baseline=raw, target="ratio <= 0.3 (issue 28)", met=med(warm) / med(raw) <= 0.3,
                note=f"{verbose[0] if verbose else ''}; sshd saw {s.connection_count() - before} new login(s)"),
            Row("status: 1 target, first (no master)", first, baseline_name="raw ssh 'pct exec 200 -- nvidia-smi ...'",
                baseline=raw, target="ratio <= 0.9 (issue 28)", met=med(first) / med(raw) <= 0.9),
            Row("status: 8 targets over 4 sshd, masters warm", eight, baseline_name="gpuops status, 1 target, warm",
                baseline=warm, target="ratio <= 1.5", met=med(eight) / med(warm) <= 1.5),
            Row("status: a closed port said (exit 3)", refused, target="<= 1 s (issue 28)", met=max(refused) <= 1.0,
                note="connection refused, not retried"),
        ]
    finally:
        _drop_masters(runtime)
        _stop(one)
        _stop(four)
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
