"""Concurrent launches and the launch lock, over real sshd + pct into CT 200 with real tmux.

Many launches at once start exactly one run; the lock is given back however a launch ends
(success, warmup failure, abort, Ctrl-C, --timeout), so the next launch proceeds and says
nothing about a recovery; a launcher that dies or goes silent leaves the lock to be recovered,
and the next launch says so.
"""

from __future__ import annotations

import fcntl
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from bench import procs, wait_until
from bench.cli import Cli, CtCli

SESSION = "conc"
GPUS = (5, 6)
RECOVERED = "recovered the launch lock left by a launcher that died"


class Ct(CtCli):
    def playbook_for(self, *, warmup: str | None = "fake-warmup --gpu {gpu} --duration 0.3",
                     command: str = "fake-train --mode steps --steps 100000 --gpus 5,6 --interval 0.1",
                     path: Path | None = None, **extra: Any) -> Path:
        data: dict[str, Any] = {
            "name": "concurrency",
            "preflight": {"gpus": list(GPUS)},
            "launch": {"session": SESSION, "command": command},
            "watch": {"stall_timeout": 60},
            "abort": {"grace": 3},
            **extra,
        }
        if warmup:
            data["warmup"] = {"gpus": [5], "command": warmup}
        return self.write(data, path)

    def lock_free(self) -> bool:
        """Nobody holds the session's flock on the target (the file lives on this machine's disk)."""
        path = self.state / "locks" / f"{SESSION}.lock"
        if not path.exists():
            return True
        with path.open("a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(fh, fcntl.LOCK_UN)
            return True

    def holder_left(self) -> str | None:
        """The holder's name a launcher that did not release the lock left behind."""
        path = self.state / "locks" / f"{SESSION}.holder"
        return path.read_text() if path.exists() else None

    def fake_trainers(self) -> list[int]:
        def cmdline(pid: int) -> bytes:
            try:
                return Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:  # gone meanwhile
                return b""

        return [p for p in self.fake.processes(self.vmid) if b"fake-train" in cmdline(p)]

    def next_launch_proceeds(self, *, recovered: bool = False) -> Cli:
        """A new detached launch gets past the lock and starts; the run is stopped again."""
        quick = self.playbook_for(path=self.playbook.with_name("next.yaml"))
        result = self.gpuops("launch", "--detach", playbook=quick)
        assert result.code == 0, result
        assert (RECOVERED in result.err) == recovered, result
        stopped = self.gpuops("stop", playbook=quick)
        assert stopped.code == 0, stopped
        return result


# -- many launches at once -------------------------------------------------------------------------
def test_six_simultaneous_launches_start_exactly_one_run(ct: Ct) -> None:
    ct.playbook_for(warmup="fake-warmup --gpu {gpu} --duration 2")
    launches = [ct.start("launch", "--detach") for _ in range(6)]
    results = [launch.finish() for launch in launches]
    codes = sorted(r.code for r in results)
    assert codes == [0, 4, 4, 4, 4, 4], "\n\n".join(map(str, results))
    (winner,) = [launch for launch, r in zip(launches, results, strict=True) if r.code == 0]
    run_id = ct.run_id()
    for r in results:
        if r.code == 4:
            # Refused while the winner held the lock (named by its pid), or after it started its run.
            holder = re.search(rf"a launch of '{SESSION}' is already in progress \(\S+ pid (\d+) since ", r.err)
            alive = f"tmux session '{SESSION}' is alive ({run_id})" in r.err
            assert (holder and int(holder.group(1)) == winner.proc.pid) or alive, r
            assert "gpuops: error:" in r.err and "Traceback" not in r.err, r
    # One run on the target: one session, one run directory, one trainer, carrying that run's id.
    assert ct.sessions() == [SESSION]
    assert [d.name for d in ct.run_dirs()] == [run_id]
    # The pane's relay starts the trainer just after tmux made the session: wait for it, then count.
    trainers = wait_until(ct.fake_trainers, message="the run's trainer to start")
    assert len(trainers) == 1, trainers
    assert procs.environ(trainers[0]).get(b"GPUOPS_RUN_ID") == run_id.encode()
    assert ct.holder_left() is None and ct.lock_free()
    assert ct.gpuops("stop").code == 0


# -- the lock is given back however a launch ends ------------------------------------------------
def _ctrl_c_during_warmup(ct: Ct) -> Cli:
    ct.playbook_for(warmup="fake-warmup --gpu {gpu} --duration 1 --mode hang")
    launch = ct.start("launch")
    launch.wait_for(lambda: "[warmup gpu5] compiling" in launch.err, "the warmup to run")
    wait_until(lambda: ct.gpu_memory((5,)) != [0], message="the warmup's GPU memory")
    launch.signal(signal.SIGINT)
    return launch.finish(timeout=60)


ENDINGS = {
    "success": (lambda ct: ct.playbook_for(command="fake-train --mode steps --steps 3 --gpus 5,6"), (), 0,
                "finished with exit code 0"),
    "warmup-failure": (lambda ct: ct.playbook_for(warmup="fake-warmup --gpu {gpu} --duration 0.2 --mode fail"), (), 5,
                       "warmup on GPU 5 exited with code 1"),
    "abort": (lambda ct: ct.playbook_for(command="fake-train --mode fx-thread --gpus 5,6 --interval 0.05"), (), 7,
              "rule 'fx-tracing-race' matched"),
    "timeout-in-warmup": (lambda ct: ct.playbook_for(warmup="fake-warmup --gpu {gpu} --duration 1 --mode hang"),
                          ("--timeout", "3"), 124, "--timeout ran out during warmup on GPU 5"),
    "timeout-in-run": (lambda ct: ct.playbook_for(), ("--timeout", "4"), 124, "--timeout ran out"),
}


@pytest.mark.parametrize("ending", [*ENDINGS, "ctrl-c-in-warmup"])
def test_the_lock_is_released_however_a_launch_ends(ct: Ct, ending: str) -> None:
    if ending == "ctrl-c-in-warmup":
        result, code, words = _ctrl_c_during_warmup(ct), 130, "interrupted before the run started"
    else:
        setup, extra, code, words = ENDINGS[ending]
        setup(ct)
        result = ct.gpuops("launch", *extra)
    assert result.code == code, result
    assert words in result.err, result
    run_id = ct.run_id()
    # Nothing of this launch is left: no session, no process (warmup included), GPUs drained.
    assert not ct.session_alive()
    assert ct.run_processes(run_id) == []
    assert ct.gpu_memory(GPUS) == [0, 0]
    # Released, not abandoned: no holder left behind, and the next launch proceeds without a recovery.
    assert ct.holder_left() is None and ct.lock_free()
    ct.next_launch_proceeds(recovered=False)


# -- a launcher that dies or goes silent -----------------------------------------------------------
def test_a_launcher_killed_mid_warmup_leaves_a_lock_the_next_launch_recovers(ct: Ct) -> None:
    ct.playbook_for(warmup="fake-warmup --gpu {gpu} --duration 1 --mode hang")
    launch = ct.start("launch")
    launch.wait_for(lambda: "[warmup gpu5] compiling" in launch.err, "the warmup to run")
    dead_run = ct.run_id()
    launch.signal(signal.SIGKILL)
    assert launch.finish().code == -signal.SIGKILL
    dead_pid = launch.proc.pid
    # The target notices at once (the connection closed): its warmup is stopped, the GPU drained,
    # and the lock freed with the dead launcher's name left on it.
    wait_until(lambda: ct.lock_free() and not ct.run_processes(dead_run), timeout=30,
               message="the target to free the lock and stop the dead launcher's warmup")
    assert ct.gpu_memory((5,)) == [0]
    assert f"pid {dead_pid} " in (ct.holder_left() or "")
    result = ct.next_launch_proceeds(recovered=True)
    assert re.search(rf"\[ct200\] {RECOVERED}: \S+ pid {dead_pid} since ", result.err), result


def test_a_silent_launcher_loses_the_lock_after_30_s_and_the_next_launch_recovers_it(ct: Ct) -> None:
    # SIGSTOP: the connection stays up but the heartbeats stop, as on a frozen laptop.
    ct.playbook_for(warmup="fake-warmup --gpu {gpu} --duration 1 --mode hang")
    frozen = ct.start("launch")
    try:
        frozen.wait_for(lambda: "[warmup gpu5] compiling" in frozen.err, "the warmup to run")
        frozen_run = ct.run_id()
        frozen.signal(signal.SIGSTOP)
        # Within the heartbeat window the lock still holds: a launch is refused, naming the holder.
        refused = ct.gpuops("launch", "--json")
        assert refused.code == 4, refused
        summary = refused.events()[-1]
        assert summary["exit_code"] == 4 and f"pid {frozen.proc.pid} since " in summary["message"], summary
        wait_until(ct.lock_free, timeout=75, message="the target to give up on the silent launcher (30 s)")
        wait_until(lambda: not ct.run_processes(frozen_run), timeout=30, message="its warmup to be stopped")
        quick = ct.playbook_for(path=ct.playbook.with_name("next.yaml"))
        result = ct.gpuops("launch", "--detach", "--json", playbook=quick)
        assert result.code == 0, result
        (event,) = [e for e in result.events() if e["event"] == "lock_recovered"]
        assert f"pid {frozen.proc.pid} since " in event["holder"] and event["target"] == "ct200"
        assert ct.gpuops("stop", playbook=quick).code == 0
    finally:
        frozen.signal(signal.SIGKILL)
        frozen.finish()
