"""The fault matrix's row for issue 35 item 6 (the run's report): its test's scenario (tests/cli/test_report_launch.py)
on a fresh real-sshd bench through faults_agent.on_bench, so the matrix and the suite cannot drift apart."""

from __future__ import annotations

from typing import Callable, List, Tuple

import test_report_launch as rl  # tests/ and its areas are on sys.path through benchkit
from bench.cli import CtCli
from faults_agent import on_bench
from test_watch import Ct

Result = Tuple[str, bool]


def huge_figure(ct: Ct) -> str:
    return rl.launch_with_a_huge_figure(CtCli(ct.fake, ct.inventory, ct.tmp / "playbook.yaml", session=rl.SESSION), ct.tmp)


REPORT_FAULTS: List[Tuple[str, Callable[[], Result]]] = [
    ("35.6 a 1.7e308 figure in the log, launch --report", on_bench(huge_figure)),
]
