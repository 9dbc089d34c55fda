"""Why it hung, and where to resume, end to end: real sshd + pct into CT 200, real tmux, real Python trainers.

What a user notices: a deadlocked trainer stalls (exit 8) and its summary carries `stacks`, and
`gpuops logs --stacks` names both deadlocked functions; `gpuops stacks` on a live run names its
training loop and the run then ends normally with every step logged; each attempt sees
GPUOPS_ATTEMPT / GPUOPS_MAX_ATTEMPTS / GPUOPS_RESTART_AFTER, the restarted one runs restart.command;
a trainer with its own SIGUSR1 handler keeps it, and its stacks still come; with py-spy there, the
stacks come through py-spy; a trainer that closed every descriptor and reopened its checkpoint keeps
the checkpoint byte for byte through a stall's stacks, and the stacks record says why it was skipped.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, SshServer, wait_until
from test_restart import run_over, with_restart
from test_watch import Ct, make_ct

TRAINERS = Path(__file__).resolve().parents[1] / "data" / "trainers"
PYTHON = shlex.quote(sys.executable)


@pytest.fixture
def ct(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Ct:
    return make_ct(sshd, fake_proxmox, tmp_path)


def python(script: str, *args: str) -> str:
    return " ".join([PYTHON, "-u", shlex.quote(str(TRAINERS / script)), *map(shlex.quote, args)])


def with_watch(ct: Ct, command: str, env: dict[str, str] | None = None, **watch: object) -> Path:
    path = ct.playbook(command, stall=watch.pop("stall", 0), grace=2)
    data = yaml.safe_load(path.read_text())
    data["watch"].update(watch)
    if env:
        data["env"] = env
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_deadlocked_trainer_stalls_and_its_stacks_name_both_deadlocked_functions(ct: Ct) -> None:
    with_watch(ct, python("deadlock.py"), stall=3)
    result = ct.gpuops("launch", "--json")
    assert result.code == 8, result
    summary = result.events()[-1]
    assert summary["outcome"] == "stalled", summary
    (entry,) = summary["stacks"]
    assert entry["via"] == "faulthandler" and entry["threads"] == 3 and entry["file"] == f"stacks/{entry['pid']}.txt"
    aborted = [e for e in result.events() if e["event"] == "aborted"]
    assert aborted and aborted[-1]["stacks"] == summary["stacks"]
    assert json.loads((ct.run_dir() / "abort-done.json").read_text())["stacks"] == summary["stacks"]
    shown = ct.gpuops("logs", "--stacks")
    assert shown.code == 0, shown
    for name in ("take_first_then_second", "take_second_then_first"):
        assert f" in {name}" in shown.out.decode(), shown
    assert "3 thread(s) via faulthandler" in shown.out.decode()
    ct.assert_run_gone()


def test_live_stacks_show_the_training_loop_and_the_run_then_ends_with_every_step(ct: Ct) -> None:
    release = ct.tmp / "release"
    with_watch(ct, python("loop.py", "30", "5", str(release)))
    assert ct.gpuops("launch", "--detach").code == 0
    wait_until(lambda: b"step 5/30" in ct.log(), timeout=60, message="the training loop at step 5")
    live = ct.gpuops("stacks", "--json")
    assert live.code == 0, live
    (proc,) = [e for e in live.events() if e["event"] == "stacks"]
    assert "in training_loop" in proc["text"] and proc["threads"] == 1, proc
    assert ct.session_alive()
    text = ct.gpuops("stacks")
    assert text.code == 0 and "in training_loop" in text.out.decode(), text
    release.touch()
    wait_until(lambda: run_over(ct), timeout=60, message="the run to end by itself")
    log = ct.log().decode()
    assert [f"step {n}/30" for n in range(1, 31)] == [ln for ln in log.splitlines() if ln.startswith("step ")]
    assert "training done" in log and (ct.run_dir() / "exit_code").read_text().strip() == "0"
    over = ct.gpuops("stacks")
    assert over.code == 2 and "is not running" in over.err, over


def test_each_attempt_sees_its_number_and_the_restarted_one_runs_restart_command(ct: Ct) -> None:
    said = "echo attempt=$GPUOPS_ATTEMPT/$GPUOPS_MAX_ATTEMPTS after=${GPUOPS_RESTART_AFTER:-none}"
    with_restart(ct, f"{said}; exit 3", {"max": 1, "on": ["failed"], "delay": 0,
                                          "command": f"{said} resumed with: --resume latest"})
    dry = ct.gpuops("launch", "--dry-run")
    assert "resumed with: --resume latest" in dry.text, dry.text
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    first = (ct.run_dir() / "attempts" / "1" / "log").read_text()
    assert "attempt=1/2 after=none" in first and "resumed" not in first
    assert "attempt=2/2 after=failed resumed with: --resume latest" in ct.log().decode()


def test_a_trainer_using_sigusr1_keeps_its_handler_and_its_stacks_still_come(ct: Ct) -> None:
    with_watch(ct, python("usr1.py"), stall=3)
    result = ct.gpuops("launch", "--json")
    assert result.code == 8, result
    assert "usr1 handled 3" in ct.log().decode()
    (entry,) = result.events()[-1]["stacks"]
    text = (ct.run_dir() / entry["file"]).read_text()
    assert "in hang_after_checkpoints" in text and entry["via"] == "faulthandler"


def test_with_py_spy_on_the_trainers_path_the_stacks_come_through_it(ct: Ct) -> None:
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        pytest.skip("py-spy is not installed here (pip install py-spy)")
    with_watch(ct, python("deadlock.py"), stall=3, env={"PATH": f"{Path(spy).parent}:/usr/bin:/bin"})
    result = ct.gpuops("launch", "--json")
    assert result.code == 8, result
    (entry,) = result.events()[-1]["stacks"]
    assert entry["via"] == "py-spy", entry
    text = (ct.run_dir() / entry["file"]).read_text()
    assert "take_first_then_second" in text and "take_second_then_first" in text


def test_a_trainer_that_closed_its_fds_keeps_its_checkpoint_intact_through_a_stalls_stacks(ct: Ct) -> None:
    checkpoint, content = ct.tmp / "checkpoint.pt", "weights of step 1\n" * 64
    with_watch(ct, python("daemon_checkpoint.py", str(checkpoint), content), stall=3)
    result = ct.gpuops("launch", "--json")
    assert result.code == 8, result
    assert "checkpoint saved on fd 3" in ct.log().decode()
    assert checkpoint.read_text() == content  # byte for byte: no stack dump written into it
    (entry,) = result.events()[-1]["stacks"]
    assert entry["file"] is None and "not signalled: the process closed gpuops' stack file" in entry["error"], entry
    assert "not signalled" in result.events()[-1]["message"], result.events()[-1]
    shown = ct.gpuops("logs", "--stacks")
    assert shown.code == 0 and f"pid {entry['pid']}: no stacks (not signalled" in shown.text, shown
    ct.assert_run_gone()
