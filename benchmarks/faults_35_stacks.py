"""The fault matrix's rows for issue 35 items 1 (a stack dump written into the training's checkpoint) and 10 (a
warmup misread as stopped): each reuses its test's scenario on a fresh real-sshd bench through
faults_agent.on_bench, so the matrix and the suite cannot drift apart."""

from __future__ import annotations

from typing import Callable, List, Tuple

import test_logs_stop as ls  # tests/ and its areas are on sys.path through benchkit
import test_stacks_bench as sb
from faults_agent import on_bench
from faults_restart import scenario

Result = Tuple[str, bool]

STACKS_FAULTS: List[Tuple[str, Callable[[], Result]]] = [
    ("35.1 a training that closed its fds reopens its checkpoint, then stalls", on_bench(scenario(
        sb.test_a_trainer_that_closed_its_fds_keeps_its_checkpoint_intact_through_a_stalls_stacks,
        "stalled (exit 8); the checkpoint on fd 3 byte-identical; the process's stacks row and the summary: "
        "'not signalled: the process closed gpuops' stack file descriptor'"))),
    ("35.10 a warmup that exits 86 or prints '@@gpuops stopped'", on_bench(scenario(
        ls.test_a_warmup_that_exits_86_or_prints_the_stop_line_is_a_failed_warmup_not_a_stop,
        "both: exit 5 'warmup on GPU 5 exited with code 86 / 3', runs says not-started 5; no abort.json"))),
]
