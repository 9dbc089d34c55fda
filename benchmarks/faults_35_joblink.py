"""The fault matrix's rows for issue 35 item 3 (a torchrun job's link through node 0's rendezvous store:
a forged end, a replayed end, node 0 killed before the others joined): each reuses its test's scenario
(tests/client/test_nodes_bench.py) on a fresh real-sshd bench through faults_agent.on_bench, with CT 201 made
beside CT 200, so the matrix and the suite cannot drift apart; what the test measured on its way
(Job.figures) is the row's figure."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Tuple

import test_nodes_bench as nb  # tests/ and its areas are on sys.path through benchkit
from bench import FakeProxmox
from faults_agent import on_bench
from test_watch import Ct

from gpuops.agent.wire import jobwire

Result = Tuple[str, bool]


def on_job(test: Callable[[nb.Job, FakeProxmox, Path], None], said: Callable[[nb.Job], str]) -> Callable[[], Result]:
    """A row: the test on a two-node job over the row's bench, then what held, with its figures."""

    def run(ct: Ct) -> str:
        tmp = ct.tmp / "job"
        tmp.mkdir()
        job = nb.make_job(ct.sshd, ct.fake, tmp)
        try:
            test(job, ct.fake, tmp)
        finally:
            nb.end_job(job)
        return said(job)

    return on_bench(run)


JOBLINK_FAULTS: List[Tuple[str, Callable[[], Result]]] = [
    ("35.3 an unsigned end written into the job's end key first", on_job(
        nb.test_a_forged_end_in_the_store_blocks_nothing_costs_one_event_and_the_job_ends_by_its_first_failing_node,
        lambda job: "said once per node (1 + 1 events), the links' CPU %.2f s over 20 steps; node 1's FX race ended "
                    "node 0 through the next slot, exit 7 on both" % job.figures["link CPU s"])),
    ("35.3 attempt 1's signed end replayed into attempt 2's key", on_job(
        nb.test_a_restart_restarts_every_node_together_on_a_fresh_rendezvous_no_old_end_ends,
        lambda job: "refused as replayed on both nodes; attempt 2 trained to the end on both, exit 0")),
    ("35.3 node 0 killed before the others joined", on_job(
        nb.test_node_0_killed_before_the_others_joined_ends_every_node_within_30s,
        lambda job: "node 1 (torchrun not joined) ended %.1f s after node 0's death (grace %g s): by the job, "
                    "first_by store-gone" % (job.figures["node 1 ended after s"], jobwire.STORE_GRACE))),
]
