"""A dead claimer and unreadable records never wedge a run (issue 19, item 5), on the real-sshd bench.

The watchdog claims the abort and signals, then it and its supervisor die in the grace while the
trainer (which catches Ctrl-C) runs on; or abort.json / watch.json are garbled. Whoever comes next
(`gpuops stop`, `gpuops logs -f`, a watchdog) finishes the sequence: no second Ctrl-C, the session
killed, the processes reaped, and the command says how the run ended.
"""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

import pytest
from bench import wait_until
from bench.watchdog import events, heartbeat, pids, remove_watchdog, wait_watching
from test_watch import Ct

RULES = [{"name": "boom", "pattern": "boom-now", "action": "abort"}]


def catching_job(ct: Ct) -> tuple[str, Path, Path]:
    """A trainer that counts each Ctrl-C (saving a checkpoint) and runs on; `go` makes it print boom-now."""
    count, go, script = ct.tmp / "sigints", ct.tmp / "go", ct.tmp / "trainer.sh"
    script.write_text("trap 'echo INT >>\"$COUNT\"' INT\n"
                      'while [ ! -e "$GO" ]; do echo step; sleep 0.1; done\n'
                      "echo boom-now\nwhile true; do echo saving; sleep 0.1; done\n")
    return f"COUNT={shlex.quote(str(count))} GO={shlex.quote(str(go))} bash {shlex.quote(str(script))}", count, go


def kill_claimer_in_the_grace(ct: Ct, go: Path) -> None:
    """The watchdog claims and sends its Ctrl-C; then it and its supervisor are SIGKILLed."""
    run = ct.run_dir()
    wait_watching(run)
    go.touch()
    wait_until(lambda: (run / "abort-signalled").exists(), timeout=30, message="the watchdog to send its Ctrl-C")
    for tool in ("supervise", "watchdog"):
        for pid in pids(run.name, tool):
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pids(run.name, "supervise") and not pids(run.name, "watchdog"), timeout=30,
               message="the claimer to be gone")
    assert ct.session_alive() and not (run / "abort-done.json").exists()


@pytest.mark.parametrize("who", ["stop", "logs -f"])
def test_a_claimer_dead_in_the_grace_is_finished_by_the_next_command(ct: Ct, who: str) -> None:
    job, count, go = catching_job(ct)
    ct.launch_detached(job, rules=RULES, grace=6)
    kill_claimer_in_the_grace(ct, go)
    if who == "stop":
        result = ct.gpuops("stop", timeout=60)
        assert result.code == 0, result
    else:
        result = ct.gpuops("logs", "-f", timeout=60)
        assert result.code == 7, result
        assert "rule 'boom' matched (stopped by the watchdog)" in result.err, result
    assert not ct.session_alive() and ct.run_processes() == []
    assert count.read_text().splitlines() == ["INT"]  # one Ctrl-C: the finisher sent none
    assert (ct.run_dir() / "abort-done.json").exists()
    assert ct.abort_record()["by"] == "watchdog"


@pytest.mark.parametrize("record", ["abort.json", "watch.json"])
def test_a_garbled_record_never_blocks_stop(ct: Ct, record: str) -> None:
    job, _, _ = catching_job(ct)
    ct.launch_detached(job, rules=RULES, grace=3)
    run = ct.run_dir()
    wait_watching(run)
    if record == "watch.json":
        remove_watchdog(run)  # it read watch.json already; a restarted one could not
    (run / record).write_text('{"reason": "match", "by": "wat')  # cut short
    result = ct.gpuops("stop", timeout=60)
    assert result.code == 0, result
    wait_until(lambda: not ct.session_alive() and ct.run_processes() == [], timeout=30,
               message="the run to be stopped")
    assert (run / "abort-done.json").exists()


def test_a_watchdog_finishes_a_claim_whose_record_is_garbled(ct: Ct) -> None:
    job, _, _ = catching_job(ct)
    ct.launch_detached(job, rules=RULES, grace=3)
    run = ct.run_dir()
    wait_watching(run)
    (run / "abort.json").write_text("\0\0\0garbled")
    wait_until(lambda: (run / "abort-done.json").exists(), timeout=60, message="the watchdog to finish the claim")
    wait_until(lambda: not ct.session_alive() and ct.run_processes() == [], timeout=30, message="the run to be gone")
    assert any(e["event"] == "abort_completed" for e in events(run))
    # its last heartbeat follows the finished sequence: waited for, not read at once
    wait_until(lambda: heartbeat(run)["state"] == "done", timeout=30, message="the watchdog's last heartbeat (done)")
