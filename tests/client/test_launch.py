"""`gpuops launch` end to end: the CLI as a user runs it, against the real sshd, real tmux and the pct/nvidia-smi stand-ins.

Every test drives `python -m gpuops launch ...` in a subprocess and checks what a user would notice:
the exit code, the words on stderr, the JSON on stdout, and the state left in the container (run
directory, tmux session, processes, GPU memory, fake-warmup's start/end/drained log).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench import FakeProxmox, LocalEnv, SshServer, jsoncheck, wait_until, write_inventory

REPO = Path(__file__).resolve().parents[2]
CT = 200
SESSION = "train"
WARMUP_OK = "fake-warmup --gpu {gpu} --duration 0.2 --steps 2"
TRAIN_OK = "fake-train --mode steps --steps 3 --interval 0.05"
# Deadlines for whole CLI runs: generous, for a loaded 2-core machine.
CLI_TIMEOUT = 120


def base_playbook() -> dict[str, Any]:
    return {
        "name": "itest",
        "target": "ct200",
        "preflight": {"gpus": [5, 6, 7]},
        "warmup": {"gpus": [5, 6, 7], "command": WARMUP_OK, "timeout": 60},
        "launch": {"session": SESSION, "command": TRAIN_OK},
        "watch": {"stall_timeout": 120},
        "abort": {"grace": 3},
    }


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `changes` into `base`; a None value removes the key."""
    out = dict(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def user_env() -> dict[str, str]:
    """This process's environment (the fixtures' PATH, HOME, ...) without the developer's GPUOPS_* options."""
    return {k: v for k, v in os.environ.items() if k not in ("GPUOPS_INVENTORY", "GPUOPS_PLAYBOOK", "GPUOPS_TARGET")}


def gpuops(*args: str, timeout: float = CLI_TIMEOUT, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`python -m gpuops ARGS` as a user runs it (no terminal: no confirmation prompt)."""
    result = subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd, env=user_env(),
    )  # fmt: skip
    jsoncheck.check(args, result.stdout)  # every --json line valid against `gpuops schema`
    return result


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def said(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


@dataclass
class Lab:
    """One fake Proxmox host behind the real sshd, CT 200 running, and files that point at it."""

    sshd: SshServer
    fake: FakeProxmox
    dir: Path
    inventory: Path

    def playbook(self, name: str = "pb.yaml", **changes: Any) -> Path:
        path = self.dir / name
        path.write_text(yaml.safe_dump(merged(base_playbook(), changes), sort_keys=False))
        return path

    def launch(self, playbook: Path, *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return gpuops("launch", "-i", str(self.inventory), "-p", str(playbook), *args, timeout=timeout)

    def popen(self, playbook: Path, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "gpuops", "launch", "-i", str(self.inventory), "-p", str(playbook), *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=user_env(),
        )  # fmt: skip

    # -- what is in the container ---------------------------------------------------------------
    @property
    def home(self) -> Path:
        return self.fake.home(CT)

    def runs(self) -> list[Path]:
        d = self.home / ".gpuops" / "runs"
        return sorted(p for p in d.iterdir() if p.is_dir()) if d.exists() else []

    def only_run(self) -> Path:
        runs = self.runs()
        assert len(runs) == 1, runs
        return runs[0]

    def meta(self, run: Path) -> dict[str, Any]:
        return json.loads((run / "meta.json").read_text())

    def session_alive(self, session: str = SESSION) -> bool:
        return self.fake.tmux(CT, "has-session", "-t", f"={session}").returncode == 0

    def warmups(self) -> list[tuple[str, int, float]]:
        """fake-warmup's (event, gpu, time) lines: start, end, drained."""
        log = self.fake.warmup_log(CT)
        if not log.exists():
            return []
        out = []
        for line in log.read_text().splitlines():
            event, gpu, when = line.split()
            out.append((event, int(gpu), float(when)))
        return out

    def when(self, event: str, gpu: int) -> float:
        times = [t for e, g, t in self.warmups() if (e, g) == (event, gpu)]
        assert len(times) == 1, (event, gpu, self.warmups())
        return times[0]

    def procs(self, needle: str) -> list[int]:
        """Live processes of the container whose command line holds `needle`."""
        return [pid for pid in self.fake.processes(CT) if needle in cmdline(pid)]


@pytest.fixture
def lab(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Lab:
    return Lab(sshd, fake_proxmox, tmp_path, write_inventory(tmp_path / "inventory.yaml", sshd))


def assert_nothing_ran(lab: Lab, others: tuple[int, ...] = ()) -> None:
    """No run directory, no session file, no tmux session, no warmup started, no trainer (but `others`)."""
    assert lab.runs() == []
    assert not (lab.home / ".gpuops" / "sessions" / SESSION).exists()
    assert not lab.session_alive()
    assert lab.warmups() == []
    assert [p for p in lab.procs("fake-train") if p not in others] == [] and lab.procs("fake-warmup") == []


# -- preflight ------------------------------------------------------------------------------------
BUSY_CASES = {
    # another job's process holds 20 GB on GPU 6 (20000 MiB + the ~900 MiB CUDA context)
    "process": (6, lambda fake: fake.occupy_gpu(CT, 6, mib=20000), r"20900 MiB", "20900 MiB used > 500 MiB"),
    # LXC: the memory shows, the process does not
    "memory-only": (7, lambda fake: fake.set_gpu(CT, 7, memory_used=1200), r"1200 MiB", "1200 MiB used > 500 MiB"),
    "utilisation": (5, lambda fake: fake.set_gpu(CT, 5, utilization=85), r"0 MiB", "85%"),
}


@pytest.mark.parametrize("case", list(BUSY_CASES))
def test_busy_gpu_fails_preflight_with_a_table_and_nothing_runs(lab: Lab, case: str) -> None:
    gpu, make_busy, memory, problem = BUSY_CASES[case]
    other = make_busy(lab.fake)
    result = lab.launch(lab.playbook())
    assert result.returncode == 4, said(result)
    assert f"GPU(s) {gpu} not idle" in result.stderr
    table = result.stderr
    assert re.search(r"^\s+GPU\s+memory used\s+limit\s+util\s+limit\s+procs\s+verdict$", table, re.M), table
    assert re.search(rf"^\s+{gpu}\s+{memory}\s+500 MiB\s+\d+%\s+10%\s+\d+\s+BUSY: .*{re.escape(problem)}", table, re.M), table
    for idle in {5, 6, 7} - {gpu}:
        assert re.search(rf"^\s+{idle}\s+0 MiB\s+500 MiB\s+0%\s+10%\s+0\s+ok$", table, re.M), table
    assert "Traceback" not in result.stderr
    assert_nothing_ran(lab, others=(other,) if other else ())


def test_busy_gpu_as_json_reports_measurements_and_thresholds(lab: Lab) -> None:
    other = lab.fake.occupy_gpu(CT, 6, mib=20000)
    result = lab.launch(lab.playbook(), "--json")
    assert result.returncode == 4, said(result)
    summary = [json.loads(line) for line in result.stdout.splitlines()][-1]
    assert summary["event"] == "summary" and summary["exit_code"] == 4 and summary["target"] == "ct200"
    assert summary["thresholds"] == {"max_memory_used_mib": 500, "max_utilization_pct": 10, "allow_processes": False}
    by_gpu = {g["index"]: g for g in summary["gpus"]}
    assert set(by_gpu) == {5, 6, 7}
    assert by_gpu[6]["memory_used_mib"] == 20900 and by_gpu[6]["processes"] == 1
    assert any("20900 MiB used > 500 MiB" in p for p in by_gpu[6]["problems"])
    assert by_gpu[5]["problems"] == [] and by_gpu[7]["problems"] == []
    assert_nothing_ran(lab, others=(other,))


@pytest.mark.parametrize("state", ["stopped", "missing"])
def test_stopped_or_missing_container_fails_preflight(lab: Lab, state: str) -> None:
    if state == "stopped":
        lab.fake.stop_container(CT)
    else:
        lab.fake.remove_container(CT)
    result = lab.launch(lab.playbook())
    assert result.returncode == 4, said(result)
    if state == "stopped":
        assert "container 200 is not running" in result.stderr
        assert "pct start 200" in result.stderr
    else:
        assert "container 200 does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert lab.fake.status(CT) == state  # gpuops did not start (or create) it
    assert not (lab.home / ".gpuops").exists()  # nothing ran inside
    assert lab.warmups() == []
    assert lab.fake.processes(CT) == []


# -- warmup ---------------------------------------------------------------------------------------
LINGER = 1.0


def test_warmups_run_in_order_each_after_the_last_drained_then_training(lab: Lab) -> None:
    command = f"fake-warmup --gpu {{gpu}} --duration 0.2 --steps 2 --mode linger --linger {LINGER}"
    train = 'echo "trainer-start $(date +%s.%N)"; ' + TRAIN_OK
    result = lab.launch(lab.playbook(warmup={"command": command}, launch={"command": train}))
    assert result.returncode == 0, said(result)
    events = lab.warmups()
    assert sorted((g, e) for e, g, _ in events) == sorted((g, e) for g in (5, 6, 7) for e in ("start", "end", "drained"))
    # Strictly one after another: each warmup starts after the one before ended (no overlap at all) ...
    assert lab.when("start", 5) < lab.when("end", 5) < lab.when("start", 6) < lab.when("end", 6) < lab.when("start", 7)
    # ... and after its memory drained, LINGER s after it exited. (`drained` is written by the lingering
    # process just after it lets the memory go: a little slack for a loaded machine.)
    for before, after in ((5, 6), (6, 7)):
        assert lab.when("start", after) >= lab.when("end", before) + 0.9 * LINGER, events
        assert lab.when("start", after) >= lab.when("drained", before) - 0.5, events
        assert f"waiting for GPU {before} memory to drain" in result.stderr
    started = float(re.search(r"^trainer-start (\S+)$", result.stdout, re.M).group(1))
    assert started >= lab.when("end", 7) + 0.9 * LINGER and started >= lab.when("drained", 7) - 0.5, (started, events)
    order = [m.group(1) for m in re.finditer(r"warmup on GPU (\d) done", result.stderr)]
    assert order == ["5", "6", "7"]
    assert result.stderr.index("warmup on GPU 7 done") < result.stderr.index("started run")


def test_failing_warmup_on_gpu6_stops_before_gpu7_and_training(lab: Lab) -> None:
    command = (
        'if [ "$GPUOPS_GPU" = 6 ]; then fake-warmup --gpu {gpu} --duration 0.2 --steps 2 --mode fail; '
        "else " + WARMUP_OK + "; fi"
    )
    pb = lab.playbook(warmup={"command": command})
    result = lab.launch(pb)
    assert result.returncode == 5, said(result)
    assert "warmup on GPU 6 exited with code 1" in result.stderr
    assert "lines of the warmup on GPU 6" in result.stderr
    assert re.search(r"^\s+\| torch\._inductor\.exc\.InductorError: RuntimeError: No valid triton configs", result.stderr, re.M)
    assert "training was not started" in result.stderr
    assert [(e, g) for e, g, _ in lab.warmups()] == [(e, g) for g in (5, 6) for e in ("start", "end", "drained")]
    run = lab.only_run()
    assert lab.meta(run)["phase"] == "warmup-failed"
    assert not (run / "log").exists() and not (run / "run.sh").exists() and not (run / "exit_code").exists()
    assert "InductorError" in (run / "warmup-6.log").read_text()
    assert not lab.session_alive()
    assert lab.procs("fake-train") == [] and lab.procs("fake-warmup") == []
    assert lab.fake.gpus(CT).memory_used(6) == 0

    # The lock was released: a launch right after goes through preflight and warms up again.
    again = lab.launch(pb)
    assert again.returncode == 5, said(again)
    assert "in progress" not in again.stderr and "preflight ok" in again.stderr
    assert len(lab.runs()) == 2


def test_failing_warmup_as_json_carries_the_output_tail(lab: Lab) -> None:
    command = 'if [ "$GPUOPS_GPU" = 6 ]; then fake-warmup --mode fail --steps 2 --duration 0.2; else ' + WARMUP_OK + "; fi"
    result = lab.launch(lab.playbook(warmup={"command": command}), "--json")
    assert result.returncode == 5, said(result)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    summary = lines[-1]
    assert summary["event"] == "summary" and summary["exit_code"] == 5 and summary["gpu"] == 6
    assert summary["target"] == "ct200" and summary["run"] == lab.only_run().name
    for ev in lines:
        assert {"ts", "event", "target"} <= set(ev) and ev["target"] == "ct200", ev
    assert any("InductorError" in line for line in summary["output_tail"])
    assert [ev["gpu"] for ev in lines if ev["event"] == "warmup_start"] == [5, 6]
    assert not any(ev["event"] == "started" for ev in lines)


def test_warmup_timeout_kills_its_whole_process_tree(lab: Lab) -> None:
    hang = "fake-warmup --gpu {gpu} --duration 0.2 --steps 2 --mode hang"
    # A child that double-forks out of the tree, and one in the foreground: both must die.
    command = f"( {hang} & ) ; {hang}"
    started = time.monotonic()
    result = lab.launch(lab.playbook(warmup={"command": command, "timeout": 3}))
    assert result.returncode == 5, said(result)
    assert "warmup on GPU 5 timed out after 3s" in result.stderr
    assert time.monotonic() - started < 60
    assert lab.procs("fake-warmup") == []
    assert lab.fake.gpus(CT).memory_used(5) == 0
    assert [(e, g) for e, g, _ in lab.warmups()].count(("start", 5)) == 2
    assert not any(g in (6, 7) for _, g, _ in lab.warmups())
    assert not lab.session_alive() and lab.procs("fake-train") == []


def test_gpu_is_substituted_and_exported_in_warmup(lab: Lab) -> None:
    # No --gpu: fake-warmup takes its GPU from GPUOPS_GPU.
    command = 'echo "arg={gpu} env=$GPUOPS_GPU literal={{gpu}}"; fake-warmup --duration 0.1 --steps 1'
    result = lab.launch(lab.playbook(warmup={"command": command}))
    assert result.returncode == 0, said(result)
    run = lab.only_run()
    for gpu in (5, 6, 7):
        assert (run / f"warmup-{gpu}.log").read_text().splitlines()[0] == f"arg={gpu} env={gpu} literal={{gpu}}"
    assert [g for e, g, _ in lab.warmups() if e == "start"] == [5, 6, 7]


# -- training -------------------------------------------------------------------------------------
def test_training_exiting_3_gives_exit_6(lab: Lab) -> None:
    result = lab.launch(lab.playbook(launch={"command": "fake-train --mode exit --steps 2 --interval 0.05 --code 3"}))
    assert result.returncode == 6, said(result)
    assert "training exited with code 3" in result.stderr
    assert "step 2/2" in result.stdout
    run = lab.only_run()
    assert (run / "exit_code").read_text() == "3\n"
    assert not lab.session_alive() and lab.procs("fake-train") == []


def test_training_command_failing_at_once_gives_exit_6(lab: Lab) -> None:
    # A typo in the script name: bash exits 127 before tmux is even asked whether the session lives.
    result = lab.launch(lab.playbook(warmup=None, launch={"command": "bash ./start_trainig.sh"}))
    assert result.returncode == 6, said(result)
    assert "training exited with code 127" in result.stderr
    assert "start_trainig.sh: No such file or directory" in result.stdout
    assert (lab.only_run() / "exit_code").read_text() == "127\n"


def test_success_exits_0_and_releases_the_lock(lab: Lab) -> None:
    pb = lab.playbook()
    first = lab.launch(pb)
    assert first.returncode == 0, said(first)
    assert "finished with exit code 0" in first.stderr
    assert [line.split(" loss")[0] for line in first.stdout.splitlines()] == ["step 1/3", "step 2/3", "step 3/3"]
    second = lab.launch(pb)
    assert second.returncode == 0, said(second)
    assert "in progress" not in second.stderr and "preflight ok" in second.stderr
    assert len(lab.runs()) == 2


DETACHED = "echo to-stdout; echo to-stderr >&2; exec fake-train --mode hold --gpus 5 --mib 100"


@pytest.mark.parametrize("ending", ["SIGKILL", "SIGTERM", "exit"])
def test_detach_returns_with_the_run_alive_and_its_records_written(lab: Lab, ending: str) -> None:
    command = DETACHED
    if ending == "exit":
        command = 'echo to-stdout; echo to-stderr >&2; while [ ! -e "$GPUOPS_RUN_DIR/go" ]; do sleep 0.05; done'
    result = lab.launch(lab.playbook(launch={"command": command}), "--detach")
    assert result.returncode == 0, said(result)
    run = lab.only_run()
    assert f"run {run.name} started in tmux session 'train'" in result.stderr
    assert result.stdout == ""
    assert lab.session_alive()
    meta = lab.meta(run)
    assert meta["phase"] == "running" and meta["id"] == run.name and meta["session"] == SESSION
    assert set(meta["warmup_seconds"]) == {"5", "6", "7"}
    assert all(isinstance(s, float) and s > 0 for s in meta["warmup_seconds"].values())
    assert meta["gpus"] == [5, 6, 7] and meta["command"] == command
    assert (lab.home / ".gpuops" / "sessions" / SESSION).read_text().strip() == run.name
    log = run / "log"
    wait_until(lambda: "to-stderr" in log.read_text(), message="both streams in the log")
    assert log.read_text() == "to-stdout\nto-stderr\n"
    assert not (run / "exit_code").exists()

    if ending == "exit":
        (run / "go").touch()
        expected = "0"
    else:
        trainers = wait_until(lambda: lab.procs("fake-train"), message="the trainer process")
        assert len(trainers) == 1
        os.kill(trainers[0], getattr(signal, ending))
        expected = str(128 + getattr(signal, ending))
    wait_until(lambda: (run / "exit_code").exists(), message="exit_code to be written")
    assert (run / "exit_code").read_text() == expected + "\n"
    wait_until(lambda: not lab.session_alive(), message="the tmux session to end")


def test_launch_while_a_run_is_alive_exits_4(lab: Lab) -> None:
    pb = lab.playbook(launch={"command": "fake-train --mode hold --gpus 0"})
    first = lab.launch(pb, "--detach")
    assert first.returncode == 0, said(first)
    run = lab.only_run()
    second = lab.launch(pb)
    assert second.returncode == 4, said(second)
    assert f"tmux session 'train' is alive ({run.name})" in second.stderr
    assert lab.runs() == [run]
    assert [g for e, g, _ in lab.warmups() if e == "start"] == [5, 6, 7]  # no second warmup
    assert len(lab.procs("fake-train")) == 1 and lab.session_alive()


# -- the launch lock -------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [2, 4])
def test_simultaneous_launches_start_exactly_one_trainer(lab: Lab, count: int) -> None:
    # The winner's warmup waits until every other launcher has given up: they all meet its lock.
    release = lab.dir / "release"
    pb = lab.playbook(
        preflight={"gpus": [5]},
        warmup={"gpus": [5], "command": f"while [ ! -e {release} ]; do sleep 0.05; done; " + WARMUP_OK},
        launch={"command": "fake-train --mode hold --gpus 0"},
    )
    launchers = [lab.popen(pb, "--detach") for _ in range(count)]
    try:
        wait_until(lambda: sum(p.poll() is not None for p in launchers) >= count - 1, timeout=90,
                   message="all launchers but one to give up")  # fmt: skip
    finally:
        release.touch()
    results = []
    for p in launchers:
        out, err = p.communicate(timeout=CLI_TIMEOUT)
        results.append((p.pid, p.returncode, out, err))
    codes = sorted(code for _, code, _, _ in results)
    assert codes == [0] + [4] * (count - 1), results
    winner = next(pid for pid, code, _, _ in results if code == 0)
    for _, code, _, err in results:
        if code == 4:
            assert "a launch of 'train' is already in progress" in err, err
            assert f"pid {winner} " in err, (winner, err)  # the message names the holder
    assert len(lab.runs()) == 1
    assert [e for e, _, _ in lab.warmups()].count("start") == 1
    # --detach returns once tmux has the session: the trainer in it may still be starting.
    wait_until(lambda: len(lab.procs("fake-train")) == 1, timeout=30, message="one trainer")
    assert lab.fake.tmux(CT, "list-sessions", "-F", "#{session_name}").stdout == "train\n"


def kill_launcher_mid_warmup(lab: Lab, how: int) -> subprocess.Popen[str]:
    """Start a launch whose warmup hangs; once the warmup runs, send `how` to the launcher."""
    hang_warmup = {"command": "fake-warmup --gpu {gpu} --duration 0.2 --steps 2 --mode hang", "timeout": 600}
    hang = lab.playbook("hang.yaml", warmup=hang_warmup)
    proc = lab.popen(hang)
    wait_until(lambda: ("start", 5) in [(e, g) for e, g, _ in lab.warmups()], timeout=60, message="the warmup to start")
    os.kill(proc.pid, how)
    return proc


def launch_until_it_proceeds(lab: Lab, pb: Path, timeout: float) -> tuple[subprocess.CompletedProcess[str], float, list[str]]:
    """Retry a launch while it says another launch is in progress; return the first other result."""
    started = time.monotonic()
    refusals: list[str] = []
    result: subprocess.CompletedProcess[str] | None = None

    def attempt() -> bool:
        nonlocal result
        result = lab.launch(pb)
        if result.returncode == 4 and "already in progress" in result.stderr:
            refusals.append(result.stderr)
            return False
        return True

    wait_until(attempt, timeout=timeout, interval=0.5, message="the launch lock to be recovered")
    assert result is not None
    return result, time.monotonic() - started, refusals


def test_lock_of_a_launcher_killed_mid_warmup_is_recovered(lab: Lab) -> None:
    dead = kill_launcher_mid_warmup(lab, signal.SIGKILL)
    dead.communicate(timeout=30)
    result, seconds, _ = launch_until_it_proceeds(lab, lab.playbook(), timeout=45)
    assert result.returncode == 0, said(result)
    assert seconds < 40
    assert "recovered the launch lock left by a launcher that died: " in result.stderr
    assert f"pid {dead.pid} " in result.stderr
    # The dead launcher's hung warmup did not outlive it (it would hold GPU 5 forever).
    assert lab.procs("--mode hang") == []
    assert len(lab.runs()) == 2


def test_lock_of_a_frozen_launcher_is_recovered_when_its_heartbeats_stop(lab: Lab) -> None:
    frozen = kill_launcher_mid_warmup(lab, signal.SIGSTOP)
    try:
        result, seconds, refusals = launch_until_it_proceeds(lab, lab.playbook(), timeout=60)
        assert result.returncode == 0, said(result)
        # The connection stayed up: only the missing heartbeats (30 s) free the lock.
        assert refusals and f"pid {frozen.pid} " in refusals[0]
        assert 15 < seconds < 50
        assert "recovered the launch lock left by a launcher that died: " in result.stderr
        assert lab.procs("--mode hang") == []
    finally:
        frozen.kill()  # SIGKILL ends a stopped process too
        frozen.communicate(timeout=30)


def test_ctrl_c_during_warmup_stops_it_and_frees_the_lock(lab: Lab) -> None:
    launcher = kill_launcher_mid_warmup(lab, signal.SIGINT)
    out, err = launcher.communicate(timeout=CLI_TIMEOUT)
    assert launcher.returncode == 130, (out, err)
    assert "training was not started" in err and "lock released" in err
    assert lab.procs("fake-warmup") == [] and lab.fake.gpus(CT).memory_used(5) == 0
    assert lab.meta(lab.only_run())["phase"] == "interrupted"
    assert not lab.session_alive()
    again = lab.launch(lab.playbook())
    assert again.returncode == 0, said(again)


def test_timeout_during_warmup_exits_124_without_training(lab: Lab) -> None:
    hang = "fake-warmup --gpu {gpu} --duration 0.2 --steps 2 --mode hang"
    result = lab.launch(lab.playbook(warmup={"command": hang, "timeout": 600}), "--timeout", "3")
    assert result.returncode == 124, said(result)
    assert "--timeout ran out during warmup on GPU 5" in result.stderr
    assert lab.procs("fake-warmup") == [] and not lab.session_alive() and lab.procs("fake-train") == []


def test_timeout_while_training_stops_the_run_and_exits_124(lab: Lab) -> None:
    result = lab.launch(lab.playbook(launch={"command": "fake-train --mode hold --gpus 5"}), "--timeout", "8")
    assert result.returncode == 124, said(result)
    run = lab.only_run()
    assert json.loads((run / "abort.json").read_text())["reason"] == "timeout"
    assert not lab.session_alive() and lab.procs("fake-train") == []
    assert lab.fake.gpus(CT).memory_used(5) == 0


# -- environment and workdir ----------------------------------------------------------------------
def hostile_value(canary: Path) -> str:
    return f"it's \"quoted\" $(touch {canary}) `touch {canary}` $HOME ${{PATH}} \\n back\\slash\nline two\ttab ünï %s *"


def test_env_values_arrive_byte_for_byte(lab: Lab, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    value = hostile_value(canary)
    pb = lab.playbook(env={"HOSTILE": value}, warmup={"gpus": [5], "command": "printenv HOSTILE"},
                      launch={"command": "printenv HOSTILE"})  # fmt: skip
    result = lab.launch(pb)
    assert result.returncode == 0, said(result)
    assert result.stdout == value + "\n"  # the trainer's log, printed as it is
    run = lab.only_run()
    assert (run / "log").read_bytes() == (value + "\n").encode()
    assert (run / "warmup-5.log").read_bytes() == (value + "\n").encode()
    assert not canary.exists()


@pytest.mark.parametrize("where", ["nowhere", "container", "playbook"])
def test_cuda_visible_devices_left_alone_unless_set(lab: Lab, where: str) -> None:
    show = 'echo "cvd=${CUDA_VISIBLE_DEVICES-unset}"'
    warm = show.replace("{", "{{").replace("}", "}}")  # only {gpu} is a placeholder in warmup commands
    changes: dict[str, Any] = {"warmup": {"gpus": [5], "command": warm}, "launch": {"command": show}}
    expected = "unset"
    if where == "container":
        lab.fake.set_env(CT, CUDA_VISIBLE_DEVICES="3")
        expected = "3"
    elif where == "playbook":
        lab.fake.set_env(CT, CUDA_VISIBLE_DEVICES="3")
        changes["env"] = {"CUDA_VISIBLE_DEVICES": "1,2"}
        expected = "1,2"
    result = lab.launch(lab.playbook(**changes))
    assert result.returncode == 0, said(result)
    assert result.stdout == f"cvd={expected}\n"
    assert (lab.only_run() / "warmup-5.log").read_text() == f"cvd={expected}\n"


def test_remote_relative_workdir_is_under_the_home(lab: Lab) -> None:
    (lab.home / "proj" / "sub").mkdir(parents=True)
    pb = lab.playbook(workdir="proj/sub", warmup={"gpus": [5], "command": "pwd"}, launch={"command": "pwd"})
    result = lab.launch(pb)
    assert result.returncode == 0, said(result)
    assert result.stdout == f"{lab.home}/proj/sub\n"
    assert (lab.only_run() / "warmup-5.log").read_text() == f"{lab.home}/proj/sub\n"


def test_missing_remote_workdir_fails_training_with_the_reason_in_the_log(lab: Lab) -> None:
    result = lab.launch(lab.playbook(workdir="no/such/dir", warmup=None, launch={"command": "pwd"}))
    assert result.returncode == 6, said(result)
    run = lab.only_run()
    assert "cannot cd to the workdir" in (run / "log").read_text()
    assert (run / "exit_code").read_text() == "126\n"


def write_local_inventory(path: Path) -> Path:
    path.write_text("hosts:\n  here:\n    transport: local\ntargets:\n  local:\n    host: here\n")
    return path


def test_local_relative_workdir_is_under_the_playbook_folder(local_env: LocalEnv, tmp_path: Path) -> None:
    folder = tmp_path / "playbooks"
    (folder / "data").mkdir(parents=True)
    pb = folder / "pb.yaml"
    pb.write_text(yaml.safe_dump({
        "target": "local",
        "workdir": "data",
        "warmup": {"gpus": [0], "command": "pwd"},
        "launch": {"session": "localtest", "command": "pwd"},
        "watch": {"stall_timeout": 60},
    }))  # fmt: skip
    inv = write_local_inventory(tmp_path / "local.yaml")
    result = gpuops("launch", "-i", str(inv), "-p", str(pb), cwd=REPO)  # run from another folder
    assert result.returncode == 0, said(result)
    assert result.stdout == f"{folder / 'data'}\n"
    runs = list((local_env.home / ".gpuops" / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "warmup-0.log").read_text() == f"{folder / 'data'}\n"
    assert local_env.tmux("has-session", "-t", "=localtest").returncode != 0


def test_local_demo_is_aborted_on_the_fx_race_with_exit_7(local_env: LocalEnv) -> None:
    result = gpuops("launch", "-i", "inventories/local.yaml", "-p", "playbooks/demo.yaml", timeout=180)
    assert result.returncode == 7, said(result)
    assert "rule 'fx-tracing-race' matched" in result.stderr
    excerpt = [line for line in result.stderr.splitlines() if line.startswith("    | ")]
    assert any("Traceback (most recent call last):" in line for line in excerpt), result.stderr
    assert any(
        "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function" in line
        for line in excerpt
    ), result.stderr
    runs = list((local_env.home / ".gpuops" / "runs").iterdir())
    assert len(runs) == 1
    abort = json.loads((runs[0] / "abort.json").read_text())
    assert abort["rule"] == "fx-tracing-race" and "Detected that you are using FX" in abort["excerpt"]
    assert local_env.tmux("has-session", "-t", "=gpuops-demo").returncode != 0
    assert [pid for pid in local_env.processes() if "demo_trainer.py" in cmdline(pid)] == []


def test_local_demo_works_when_the_python3_on_path_is_not_the_one_gpuops_is_installed_in(local_env: LocalEnv) -> None:
    """gpuops in an unactivated venv or with pipx: `python3` on PATH is another interpreter, without gpuops.
    The demo trainer and the watchdog need only the standard library, so the demo still runs."""
    import shutil

    other = "/usr/bin/python3"
    if not os.path.exists(other) or subprocess.run([other, "-c", "import gpuops"], capture_output=True, cwd="/").returncode == 0:
        pytest.skip("no python3 without gpuops here to stand for the unactivated venv's PATH")
    bindir = local_env.root / "other-python-bin"
    bindir.mkdir()
    for tool in ("python3", "tmux", "bash", "flock"):
        found = other if tool == "python3" else shutil.which(tool)
        (bindir / tool).symlink_to(found)
    env = {**user_env(), "PATH": f"{bindir}:/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "gpuops", "launch", "-i", "inventories/local.yaml", "-p",
                             "playbooks/demo.yaml"], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
                            cwd=REPO, env=env)
    assert result.returncode == 7, said(result)
    assert "rule 'fx-tracing-race' matched" in result.stderr


# -- JSON and secrets ---------------------------------------------------------------------------------
def parse_iso(ts: str) -> dt.datetime:
    assert ts.endswith("Z"), ts
    return dt.datetime.fromisoformat(ts[:-1] + "+00:00")


def test_json_prints_only_event_lines_and_a_final_summary(lab: Lab) -> None:
    result = lab.launch(lab.playbook(launch={"command": "echo out; echo err >&2; " + TRAIN_OK}), "--json")
    assert result.returncode == 0, said(result)
    assert result.stderr == ""
    events = [json.loads(line) for line in result.stdout.splitlines()]  # every line is JSON
    run = lab.only_run().name
    for ev in events:
        assert {"ts", "event", "target"} <= set(ev), ev
        assert ev["target"] == "ct200"
        parse_iso(ev["ts"])
        if ev["event"] not in ("preflight_ok",):
            assert ev.get("run") == run, ev
    kinds = [ev["event"] for ev in events]
    assert kinds[0] == "preflight_ok" and kinds[1] == "run_created"
    assert [ev["gpu"] for ev in events if ev["event"] == "warmup_done"] == [5, 6, 7]
    assert kinds.index("started") > max(i for i, k in enumerate(kinds) if k == "warmup_done")
    lines = [ev["line"] for ev in events if ev["event"] == "log"]
    assert lines[:2] == ["out", "err"] and lines[-1].startswith("step 3/3")
    summary = events[-1]
    assert summary["event"] == "summary" and kinds.count("summary") == 1
    assert (summary["outcome"], summary["exit_code"]) == ("succeeded", 0)


def test_json_summary_of_a_failed_training(lab: Lab) -> None:
    result = lab.launch(lab.playbook(launch={"command": "fake-train --mode exit --steps 1 --code 3"}), "--json")
    assert result.returncode == 6, said(result)
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["event"] == "summary" and summary["exit_code"] == 6 and summary["command_exit_code"] == 3


SECRET = "hf_s3cr3t-Value-0123456789"


def secret_playbook(lab: Lab, **changes: Any) -> Path:
    show = 'printf %s "$HF_TOKEN" | sha256sum'
    return lab.playbook(**merged({
        "env": {"HF_TOKEN": SECRET, "PLAIN": "visible"},
        "warmup": {"gpus": [5], "command": show},
        "launch": {"command": show},
    }, changes))  # fmt: skip


@pytest.mark.parametrize("mode", ["text", "json"])
def test_secrets_reach_the_job_but_never_the_output_or_records(lab: Lab, mode: str) -> None:
    args = ["--json"] if mode == "json" else []
    result = lab.launch(secret_playbook(lab), *args)
    assert result.returncode == 0, said(result)
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    assert digest in result.stdout  # the trainer got the exact value
    assert SECRET not in result.stdout and SECRET not in result.stderr
    run = lab.only_run()
    assert digest in (run / "warmup-5.log").read_text()
    meta_text = (run / "meta.json").read_text()
    assert SECRET not in meta_text
    assert json.loads(meta_text)["env"] == {"HF_TOKEN": "***", "PLAIN": "visible"}


def test_secret_printed_by_a_failing_warmup_is_masked(lab: Lab) -> None:
    pb = secret_playbook(lab, warmup={"command": 'echo "logging in with $HF_TOKEN"; exit 1'})
    text = lab.launch(pb)
    assert text.returncode == 5, said(text)
    assert "logging in with ***" in text.stderr
    as_json = lab.launch(pb, "--json")
    assert as_json.returncode == 5, said(as_json)
    summary = json.loads(as_json.stdout.splitlines()[-1])
    assert "logging in with ***" in summary["output_tail"]
    for result in (text, as_json):
        assert SECRET not in result.stdout and SECRET not in result.stderr
    for run in lab.runs():
        assert SECRET not in (run / "meta.json").read_text()
