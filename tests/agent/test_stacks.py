"""Thread stacks, piece by piece: the parser on real py-spy and faulthandler output, gpuops' faulthandler
in a real Python process (its own signal, the training's handlers kept, a forked child, a hidden
sitecustomize still run), the bounded take, and the playbook keys."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench import wait_until
from bench.playbooks import playbook_error, write_playbook

from gpuops.agent.run import stacks
from gpuops.agent.wire import stackfile
from gpuops.config import load_playbook

PYTHONPATH = Path(stacks.__file__).resolve().parent.parent / "guard" / "pythonpath"

PYSPY = """Process 4242: python3 train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    clock_nanosleep (libc.so.6)
    wait (threading.py:331)
    training_loop (train.py:12)
    <module> (train.py:20)
Thread 4250 (active): "loader"
    next_batch (data.py:40)
"""
FAULTHANDLER = """# gpuops stacks of pid 4242 via faulthandler
Thread 0x00007ff61ffff6c0 (most recent call first):
  File "/w/train.py", line 8 in take_first_then_second
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007ff625c9eb80 (most recent call first):
  File "/w/train.py", line 14 in <module>
"""


def test_the_parser_reads_py_spy_and_faulthandler_threads_with_their_functions() -> None:
    spy = stackfile.parse(PYSPY)
    assert [(t["id"], t["name"], t["state"]) for t in spy] == [("4242", "MainThread", "idle"), ("4250", "loader", "active")]
    assert [f["function"] for f in spy[0]["frames"]] == ["clock_nanosleep", "wait", "training_loop", "<module>"]
    assert spy[0]["frames"][2] == {"function": "training_loop", "file": "train.py", "line": 12}
    assert spy[0]["frames"][0]["line"] is None  # a native frame
    fh = stackfile.parse(FAULTHANDLER)
    assert len(fh) == 2 and fh[0]["frames"][0] == {"function": "take_first_then_second", "file": "/w/train.py", "line": 8}
    assert stackfile.functions(FAULTHANDLER) == ["take_first_then_second", "run", "<module>"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory of its own run id (the take finds processes by their run's marker)."""
    d = tmp_path / f"20261203-000000-{os.urandom(3).hex()}"
    (d / "stacks").mkdir(parents=True)
    return d


def start(run_dir: Path, code: str, argv: tuple[str, ...] | list[str] = (), **env: str) -> subprocess.Popen:
    """A Python process of the run, as run.sh starts it (marker, run dir, gpuops' folder first on PYTHONPATH)."""
    full = {**os.environ, "GPUOPS_RUN_ID": run_dir.name, "GPUOPS_RUN_DIR": str(run_dir),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PYTHONPATH), env.pop("PYTHONPATH", "")])), **env}
    return subprocess.Popen([sys.executable, "-u", "-c", code, *argv], env=full, stdout=subprocess.PIPE, text=True)


def registered(run_dir: Path, pid: int) -> int:
    wait_until(lambda: (run_dir / "stacks" / f"{pid}.signal").exists(), timeout=30, message="the faulthandler record")
    return int((run_dir / "stacks" / f"{pid}.signal").read_text().split()[0])


SETS_GPUOPS_SIGNAL = """
import os, signal, time
got = []
chosen = int(open(os.environ["GPUOPS_RUN_DIR"] + "/stacks/%d.signal" % os.getpid()).read().split()[0])
signal.signal(chosen, lambda *a: got.append(1))
print(chosen, flush=True)
def waits_for_its_signal():
    while not got:
        time.sleep(0.01)
    print("own handler ran", flush=True)
    time.sleep(60)
waits_for_its_signal()
"""


def test_a_training_that_takes_gpuops_signal_keeps_it_and_gpuops_moves_to_another(run_dir: Path) -> None:
    proc = start(run_dir, SETS_GPUOPS_SIGNAL)
    try:
        taken = int(proc.stdout.readline())
        wait_until(lambda: registered(run_dir, proc.pid) != taken, timeout=30, message="gpuops on another signal")
        (row,) = stacks.take(str(run_dir), run_dir.name)
        assert row["via"] == "faulthandler" and "waits_for_its_signal" in (run_dir / row["file"]).read_text()
        os.kill(proc.pid, taken)
        assert proc.stdout.readline().strip() == "own handler ran"
    finally:
        proc.kill()
        proc.wait()


def test_sigusr_handlers_stay_the_trainings_and_a_forked_child_registers_for_itself(run_dir: Path) -> None:
    code = """
import os, signal, time
signal.signal(signal.SIGUSR1, lambda *a: print("usr1", flush=True))
child = os.fork()
def parent_waits():
    time.sleep(60)
def child_waits():
    time.sleep(60)
child_waits() if child == 0 else parent_waits()
"""
    proc = start(run_dir, code)
    try:
        first = registered(run_dir, proc.pid)
        assert first not in (signal.SIGUSR1, signal.SIGUSR2)
        wait_until(lambda: len(list((run_dir / "stacks").glob("*.signal"))) == 2, timeout=30, message="the child's record")
        rows = stacks.take(str(run_dir), run_dir.name)
        seen = {r["pid"]: stackfile.functions((run_dir / r["file"]).read_text()) for r in rows}
        assert len(seen) == 2 and seen[proc.pid] == ["parent_waits", "<module>"], seen
        assert [f for pid, f in seen.items() if pid != proc.pid] == [["child_waits", "<module>"]], seen
        os.kill(proc.pid, signal.SIGUSR1)
        assert proc.stdout.readline().strip() == "usr1"
    finally:
        for r in stacks.python_pids(str(run_dir / "stacks"), run_dir.name):
            os.kill(r, signal.SIGKILL)
        proc.wait()


DUP2_OVER_THE_STACK_FILE = """
import os, sys, time
ours = os.environ["GPUOPS_RUN_DIR"] + "/stacks/%d.fault" % os.getpid()
(fd,) = [int(n) for n in os.listdir("/proc/self/fd") if os.path.realpath("/proc/self/fd/" + n) == os.path.realpath(ours)]
ckpt = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.write(ckpt, b"weights\\n" * 100)
os.dup2(ckpt, fd)  # the training's checkpoint now sits on the number gpuops' faulthandler writes to
print(fd, flush=True)
def hangs_with_the_checkpoint_on_that_number():
    time.sleep(60)
hangs_with_the_checkpoint_on_that_number()
"""


def test_a_training_that_dup2s_its_checkpoint_over_gpuops_descriptor_is_skipped_and_its_file_kept(
        run_dir: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt.pt"
    proc = start(run_dir, DUP2_OVER_THE_STACK_FILE, argv=[str(checkpoint)])
    try:
        fd = int(proc.stdout.readline())
        (row,) = stacks.take(str(run_dir), run_dir.name, wait=1.0)
        assert row["file"] is None and row["via"] == "faulthandler", row
        assert row["error"] == (f"not signalled: gpuops' stack file descriptor {fd} is now {checkpoint} in the process "
                                "(it closed the stack file and reused the number): no dump written into it"), row
        assert checkpoint.read_bytes() == b"weights\n" * 100
    finally:
        proc.kill()
        proc.wait()


def test_a_sitecustomize_the_environment_has_still_runs(run_dir: Path, tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITE'] = 'ran'\n")
    proc = start(run_dir, "import os; print(os.environ.get('OWN_SITE'))", PYTHONPATH=str(own))
    assert proc.communicate(timeout=60)[0].strip() == "ran"
    assert not list((run_dir / "stacks").glob("*.signal"))  # a process that ended takes its records with it


def test_a_process_that_cannot_answer_is_noted_and_the_take_returns_in_time(run_dir: Path) -> None:
    proc = start(run_dir, "import time\ndef sleeps():\n    time.sleep(60)\nsleeps()")
    try:
        registered(run_dir, proc.pid)
        os.kill(proc.pid, signal.SIGSTOP)
        began = time.monotonic()
        (row,) = stacks.take(str(run_dir), run_dir.name, wait=1.0)
        assert row["file"] is None and "no answer within 1s" in row["error"] and row["via"] == "faulthandler"
        assert time.monotonic() - began < 30
    finally:
        proc.kill()
        proc.wait()


def test_nothing_registers_where_the_run_takes_no_stacks(run_dir: Path) -> None:
    (run_dir / "stacks").rmdir()  # watch.stacks: off
    proc = start(run_dir, "print([ln for ln in open('/proc/self/status') if ln.startswith('SigCgt')][0].split()[1])")
    caught = int(proc.communicate(timeout=60)[0], 16)
    assert not any(caught & (1 << (s - 1)) for s in range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    assert not (run_dir / "stacks").exists()


def test_watch_stacks_and_restart_command_keys(tmp_path: Path) -> None:
    launch = "launch: {session: s, command: c}\n"
    path = write_playbook(tmp_path, launch, "watch: {stacks: always}\nrestart: {max: 1, on: [stall], command: c --resume}\n")
    pb = load_playbook(path, environ={})
    assert (pb.watch.stacks, pb.restart.command) == ("always", "c --resume")
    assert load_playbook(write_playbook(tmp_path, launch, "watch: {stacks: off}\n"), environ={}).watch.stacks == "off"
    assert load_playbook(write_playbook(tmp_path, launch, ""), environ={}).watch.stacks == "on_stall"
    said = playbook_error(write_playbook(tmp_path, launch, "watch: {stacks: sometimes}\n"))
    assert "when to record the training's stacks" in said and "on_stall" in said, said
    said = playbook_error(write_playbook(tmp_path, launch, "restart: {max: 1, on: [stall], command: ''}\n"))
    assert "restart.command" in said or "command" in said, said


def test_the_stacks_tools_answer_is_read_by_the_protocol() -> None:
    from gpuops.agent.wire.marks import mark, parse_stacks

    line = mark("stacks", json.dumps({"pid": 7, "file": "stacks/7.txt", "threads": 2, "via": "py-spy", "text": PYSPY}))
    assert parse_stacks("noise\n" + line + "\n") == [{"pid": 7, "file": "stacks/7.txt", "threads": 2, "via": "py-spy",
                                                      "text": PYSPY}]
