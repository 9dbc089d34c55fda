"""The test bench: a real OpenSSH server on 127.0.0.1, real tmux, and strict stand-ins for pct and nvidia-smi.

Import from tests as `from bench import SshServer, FakeProxmox, write_inventory, wait_until`.
"""

from __future__ import annotations

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent
BIN_DIR = TESTS_DIR / "standins" / "bin"  # pct, nvidia-smi, fake-train, fake-warmup
LOGS_DIR = TESTS_DIR / "data" / "logs"  # saved real failure logs, replayed by fake-train
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BENCH_PATH = f"{BIN_DIR}:{SYSTEM_PATH}"

from bench.fakes import FakeProxmox, LocalEnv  # noqa: E402
from bench.gpus import FakeGpus  # noqa: E402
from bench.inventory import write_inventory  # noqa: E402
from bench.sshd import SshServer  # noqa: E402
from bench.waiting import WaitTimeout, wait_until  # noqa: E402

__all__ = [
    "BENCH_PATH",
    "BIN_DIR",
    "LOGS_DIR",
    "SYSTEM_PATH",
    "FakeGpus",
    "FakeProxmox",
    "LocalEnv",
    "SshServer",
    "WaitTimeout",
    "wait_until",
    "write_inventory",
]
