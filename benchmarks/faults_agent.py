"""The fault matrix's rows for issue 19 items 1-5, 9-11: each fault injected into a live run on a fresh
real-sshd bench, reusing its test's scenario (tests/test_faults_*.py), so the matrix and the suite
cannot drift apart. A row is a (name, function) pair of AGENT_FAULTS; a function returns (outcome,
protected) as bench_faults.FAULTS expects: protected is False when the run was hurt or the
protection was gone (the scenario's assertion failed)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable, List, Tuple

from benchkit import servers, stop

import test_faults_abort as fa  # tests/ and its areas are on sys.path through benchkit
import test_faults_agent as fg
import test_faults_interrupts as fi
import test_faults_logs as fl
import test_faults_reap as fr
from bench.faults import can_mount
from test_watch import Ct, make_ct

Result = Tuple[str, bool]


def on_bench(scenario: Callable[[Ct], str]) -> Callable[[], Result]:
    """A row: the scenario on a fresh CT 200; its words when it held, the assertion that failed when not."""

    def row() -> Result:
        pairs = servers(1, (200,))
        tmp = Path(tempfile.mkdtemp(prefix="gpuops-fault-"))
        try:
            said = scenario(make_ct(pairs[0][0], pairs[0][1], tmp))
            return said, True
        except AssertionError as exc:
            return "NOT SURVIVED: " + (str(exc).splitlines() or [type(exc).__name__])[0][:160], False
        finally:
            stop(pairs)
            shutil.rmtree(tmp, ignore_errors=True)

    return row


def _by(ct: Ct) -> str:
    return f"the FX race after it stopped by the {ct.abort_record()['by']}"


def tmux_mismatch(ct: Ct) -> str:
    fg.test_a_failing_tmux_never_ends_a_healthy_run(ct, "protocol version mismatch (client 8, server 7)")
    return "run alive through a restarted watchdog's failing tmux calls; " + _by(ct)


def tmux_socket(ct: Ct) -> str:
    fg.test_a_failing_tmux_never_ends_a_healthy_run(ct, "no server running on /tmp/tmux-0/default")
    return "run alive (its server still listens); " + _by(ct)


def full_disk(ct: Ct) -> str:
    if not can_mount():
        raise AssertionError("needs root and mount(8) for a tmpfs")
    fg.test_a_full_disk_for_a_while_leaves_the_run_protected(ct)  # asserts the stop by the watchdog (the tmpfs is gone now)
    return "run alive through 3 s of ENOSPC; the FX race after it stopped by the watchdog"


def sigterm(ct: Ct) -> str:
    fg.test_a_watchdog_killed_with_sigterm_is_started_again(ct)
    return "watchdog started again; " + _by(ct)


def sigstop(ct: Ct) -> str:
    fg.test_a_frozen_watchdog_is_killed_and_started_again(ct)
    return "frozen watchdog killed, started again; " + _by(ct)


def claimer_stop(ct: Ct) -> str:
    fa.test_a_claimer_dead_in_the_grace_is_finished_by_the_next_command(ct, "stop")
    return "`gpuops stop` exit 0, it finished the sequence: one Ctrl-C, session and processes gone"


def claimer_follow(ct: Ct) -> str:
    fa.test_a_claimer_dead_in_the_grace_is_finished_by_the_next_command(ct, "logs -f")
    return "`logs -f` exit 7, it finished the sequence: one Ctrl-C, session and processes gone"


def garbled(record: str) -> Callable[[Ct], str]:
    def scenario(ct: Ct) -> str:
        fa.test_a_garbled_record_never_blocks_stop(ct, record)
        return "`gpuops stop` exit 0; run stopped, abort-done.json written"
    return scenario


def rewritten(ct: Ct) -> str:
    fl.test_a_log_truncated_and_rewritten_past_its_size_is_read_again_from_byte_0(ct)
    return "read again from byte 0; the FX race at byte 0 stopped by the watchdog"


def moved(how: str) -> Callable[[Ct], str]:
    def scenario(ct: Ct) -> str:
        fl.test_a_log_renamed_or_deleted_is_read_on_while_the_job_writes_it(ct, how)
        return f"no false stall while it logs on; the FX race in the {how} file stopped by the watchdog"
    return scenario


def worker(how: str) -> Callable[[Ct], str]:
    def scenario(ct: Ct) -> str:
        fr.test_a_worker_without_the_run_marker_is_reaped_and_the_gpus_drain(ct, how)
        return "aborted; the unmarked worker reaped, GPUs drained to 0 MiB, survivors []"
    return scenario


def foreign_holder(ct: Ct) -> str:
    fr.test_a_gpu_that_does_not_drain_is_said_with_its_holders(ct)
    return "stopped; 'GPU 6 DID NOT DRAIN (held by pids [...])', the other job left alone"


def interrupted_twice(ct: Ct) -> str:
    fake = ct.fake
    for vmid in fi.CTS[1:]:
        fake.add_container(vmid)
    inventory = fi.write_inventory(ct.tmp / "three.yaml", ct.sshd, extra_targets={
        f"ct{v}": {"host": "pve1", "ctid": v, "gpus": list(range(8))} for v in fi.CTS[1:]})
    playbook = ct.tmp / "interrupted.yaml"
    playbook.write_text(fi.yaml.safe_dump({
        "name": "interrupted", "preflight": {"gpus": [5]},
        "warmup": {"gpus": [5], "command": "fake-warmup --gpu {gpu} --duration 60 --steps 60"},
        "launch": {"session": "train", "command": "true"}, "watch": {"stall_timeout": 0}}))
    fi.test_ctrl_c_twice_mid_warmup_ends_every_targets_warmup_before_exit((fake, inventory, playbook), 0.3)
    return "exit 130 once all 3 warmups ended; no lock holder left"


AGENT_FAULTS: List[Tuple[str, Callable[[], Result]]] = [
    ("19.1 tmux has-session fails (version mismatch)", on_bench(tmux_mismatch)),
    ("19.1 tmux socket deleted (no server running)", on_bench(tmux_socket)),
    ("19.2 the disk full for 3 s (a 24 MiB tmpfs)", on_bench(full_disk)),
    ("19.3 kill -TERM the watchdog", on_bench(sigterm)),
    ("19.4 kill -STOP the watchdog", on_bench(sigstop)),
    ("19.5 claimer killed in the grace, then stop", on_bench(claimer_stop)),
    ("19.5 claimer killed in the grace, then logs -f", on_bench(claimer_follow)),
    ("19.5 a garbled abort.json, then stop", on_bench(garbled("abort.json"))),
    ("19.5 a garbled watch.json, then stop", on_bench(garbled("watch.json"))),
    ("19.9 log truncated and rewritten past its size", on_bench(rewritten)),
    ("19.9 log renamed (mv log log.1)", on_bench(moved("renamed"))),
    ("19.9 log deleted", on_bench(moved("deleted"))),
    ("19.10 a worker started with setsid env -i", on_bench(worker("child"))),
    ("19.10 a worker double-forked away", on_bench(worker("double-fork"))),
    ("19.10 another job holds a run GPU", on_bench(foreign_holder)),
    ("19.11 Ctrl-C twice to a 3-target launch mid-warmup", on_bench(interrupted_twice)),
]
