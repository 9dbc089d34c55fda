"""The test bench: a real OpenSSH server on 127.0.0.1, real tmux, and strict stand-ins for pct and nvidia-smi.

Import from tests as `from bench import SshServer, FakeProxmox, write_inventory, wait_until`.
"""

from __future__ import annotations

import signal
from pathlib import Path

# A suite started in the background of a shell without job control (`cmd &` in a script, a CI step run
# that way) inherits SIGINT ignored, and so does every gpuops it starts: the Ctrl-C tests would see a
# command that cannot be interrupted. A handler here makes the children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TESTS_DIR = Path(__file__).resolve().parent.parent
BIN_DIR = TESTS_DIR / "standins" / "bin"  # pct, nvidia-smi, fake-train, fake-warmup
LOGS_DIR = TESTS_DIR / "data" / "logs"  # saved real failure logs, replayed by fake-train
#: The tests' folders, one per area of the package (agent/, cli/, client/, config/, transport/; real/: what
#: the real GPU machine recorded), beside tests/ itself (the top-level modules and the project as a whole).
#: A test module imports another's helpers by its name (`from test_watch import Ct`), wherever each lives:
#: tests/conftest.py and benchmarks/benchkit.py put every one of these on sys.path.
TEST_AREAS = tuple(sorted({path.parent for path in TESTS_DIR.glob("*/test_*.py")}))
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
    "TEST_AREAS",
    "FakeGpus",
    "FakeProxmox",
    "LocalEnv",
    "SshServer",
    "WaitTimeout",
    "wait_until",
    "write_inventory",
]
