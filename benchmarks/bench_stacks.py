"""The pause `gpuops stacks` causes a live run: step intervals of a training loop before and while its stacks are taken.

A Python loop of 5 ms steps (a sleep and a little work, four threads idling beside it, as a DataLoader's
would) writes each step's monotonic time; its stacks are taken TAKES times through gpuops' faulthandler
(agent/run/stacks.py, as `gpuops stacks` does) and, where py-spy is installed, through `py-spy dump
--native`. Printed: the median step interval, and the longest one while each take ran (the pause).

    python3 benchmarks/bench_stacks.py
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuops.agent.run import stacks  # noqa: E402

TAKES = 10
LOOP = """
import sys, threading, time
for _ in range(4):
    threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
out = open(sys.argv[1], "w", buffering=1)
def training_loop():
    while True:
        sum(i * i for i in range(2000))
        time.sleep(0.005)
        out.write("%.6f\\n" % time.monotonic())
training_loop()
"""


def intervals(path: Path, start: float, end: float) -> list[float]:
    stamps = [float(x) for x in path.read_text().split()]
    return [b - a for a, b in itertools.pairwise(stamps) if start <= b <= end + 0.5]


def measure(via: str) -> tuple[float, float, float]:
    """(median step interval before, median while taking, longest while taking), milliseconds."""
    with tempfile.TemporaryDirectory() as tmp:
        run_id = "20261203-000000-be0c4e"
        d = Path(tmp) / run_id
        (d / "stacks").mkdir(parents=True)
        steps = Path(tmp) / "steps"
        env = {**os.environ, "GPUOPS_RUN_ID": run_id, "GPUOPS_RUN_DIR": str(d),
               "PYTHONPATH": str(ROOT / "gpuops" / "agent" / "guard" / "pythonpath"),
               "PATH": os.environ["PATH"] if via == "py-spy" else "/usr/bin:/bin"}
        proc = subprocess.Popen([sys.executable, "-c", LOOP, str(steps)], env=env)
        old = os.environ["PATH"]
        os.environ["PATH"] = env["PATH"]
        try:
            time.sleep(2.0)
            calm_from = time.monotonic()
            time.sleep(2.0)
            calm = intervals(steps, calm_from, time.monotonic())
            during, worst = [], 0.0
            for _ in range(TAKES):
                began = time.monotonic()
                (row,) = stacks.take(str(d), run_id)
                ended = time.monotonic()
                assert row["via"] == via, row
                time.sleep(0.3)
                got = intervals(steps, began, ended)
                during += got
                worst = max([worst] + got)
            return statistics.median(calm) * 1e3, statistics.median(during) * 1e3, worst * 1e3
        finally:
            os.environ["PATH"] = old
            proc.kill()
            proc.wait()


def main() -> int:
    ways = ["faulthandler"] + (["py-spy"] if shutil.which("py-spy") else [])
    print(f"step interval of a 5 ms training loop, {TAKES} takes each (ms)")
    print(f"{'via':<14}{'median before':>15}{'median during':>15}{'longest during':>16}")
    for via in ways:
        before, during, worst = measure(via)
        print(f"{via:<14}{before:>15.2f}{during:>15.2f}{worst:>16.2f}")
    if len(ways) == 1:
        print("py-spy: not installed here (pip install py-spy), not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
