"""The fault matrix's rows for issue 29 (restarts, the GPU lease, the stop, a full disk): each reuses its
test's scenario (tests/agent/test_restart_faults.py) on a fresh real-sshd bench through faults_agent.on_bench, so
the matrix and the suite cannot drift apart. The race windows are held open at their named points
(GPUOPS_TEST_PAUSE_AT), not hit by luck."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, List, Tuple

import test_openssh
import test_restart_faults as rf  # tests/ and its areas are on sys.path through benchkit
from bench.faults import can_mount
from faults_agent import on_bench
from test_watch import Ct

Result = Tuple[str, bool]


def scenario(test: Callable[[Ct], None], said: str) -> Callable[[Ct], str]:
    """A row's scenario: its test on the row's bench, then what held when it passed."""

    def run(ct: Ct) -> str:
        test(ct)
        return said

    return run


def known_hosts_space(ct: Ct) -> str:
    case = ct.tmp / "known-hosts-case"
    case.mkdir()
    test_openssh.test_a_user_known_hosts_file_with_a_space_is_the_file_checked(case, ct.sshd, ct.fake)
    return "UserKnownHostsFile \"my hosts/kh\" checked; a rotated key refused (exit 3), no stray file written"


def full_disk_claim() -> Result:
    if not can_mount():
        return "skipped: needs root and mount(8)", True
    try:
        rf.test_the_abort_claim_works_with_0_bytes_free_and_leaves_no_claim_files(Path(tempfile.mkdtemp()))
    except AssertionError as exc:
        return "NOT SURVIVED: " + str(exc)[:160], False
    return "0 bytes free: the claim is won (empty abort.json), the second loses, no claim file left", True


RESTART_FAULTS: List[Tuple[str, Callable[[], Result]]] = [
    ("29.1 stop while the watchdog files attempt 1 away", on_bench(scenario(
        rf.test_a_stop_while_the_watchdog_files_the_ended_attempt_away_ends_the_run_for_good,
        "watchdog held between publishing attempt 2 and filing attempt 1: the stop waited for the step, ended the run"))),
    ("29.2 a restart delay past the freeze limit", on_bench(scenario(
        rf.test_a_restart_delay_longer_than_the_freeze_limit_passes_with_the_same_watchdog,
        "15 s delay (freeze limit 8 s): the same watchdog started attempt 2, no watchdog_restarted"))),
    ("29.3 another launch on the GPUs between attempts", on_bench(scenario(
        rf.test_another_playbooks_launch_on_the_gpus_of_a_run_between_attempts_is_refused,
        "another playbook's launch in the delay: exit 4 'between attempts'; it runs once the run ended"))),
    ("29.4 an attempt's end leaves a GPU held", on_bench(scenario(
        rf.test_an_attempt_that_crashed_is_followed_only_on_drained_gpus_and_a_foreign_holder_ends_the_run,
        "attempt 1 exited 3 leaving an unmarked worker on GPU 6, another job took GPU 5: the worker killed, "
        "attempt 2 not started, 'GPU 5 held by pids [...]'"))),
    ("29.5 Ctrl-C of a following launch in a healthy attempt 2", on_bench(scenario(
        rf.test_ctrl_c_of_a_following_launch_during_a_healthy_attempt_2_leaves_it_running,
        "exit 130, 'still alive ... Reattach with: gpuops logs -f'; attempt 2 running, no abort"))),
    ("29.5 restarted attempts that end within a second", on_bench(scenario(
        rf.test_short_restarted_attempts_are_streamed_in_full_twice_in_a_row,
        "attempts 2 and 3 of ~0.2 s each: every line of both in launch's output"))),
    ("29.6 the abort claim with 0 bytes free", full_disk_claim),
    ("29.9 a UserKnownHostsFile with a space", on_bench(known_hosts_space)),
]
