"""`launch.compile_guard` end to end, over the real sshd + pct stand-in path: the playbook key turns
the guard on for warmup and training (the playbook's PYTHONPATH kept after the guard's folder),
`status` shows its counts for the live run, `--dry-run` shows it, a bad value is refused.

The jobs are tests/agent/guard_cases.py against the stand-in torch (on the playbook's PYTHONPATH), whose
overlapping first compiled calls raise the real FX error unless the guard serializes them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, SshServer, wait_until, write_inventory
from test_launch import Lab, gpuops, said

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "agent" / "guard_cases.py"
STANDINS = REPO / "tests" / "standins"
FX = "Detected that you are using FX to symbolically trace a dynamo-optimized function."


@pytest.fixture
def lab(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Lab:
    """test_launch's lab: CT 200 behind the real sshd."""
    return Lab(sshd, fake_proxmox, tmp_path, write_inventory(tmp_path / "inventory.yaml", sshd))


def guard_playbook(lab: Lab, guard: bool | None) -> Path:
    """Warmup on GPU 5 and training both run three threads first-calling compiled functions; training
    then waits for $GPUOPS_RUN_DIR/go, so status can look at the live run."""
    job = f"python3 {CASES} functions"
    launch = {"command": f'{job} && while [ ! -e "$GPUOPS_RUN_DIR/go" ]; do sleep 0.05; done'}
    if guard is not None:
        launch["compile_guard"] = guard
    return lab.playbook(
        env={"PYTHONPATH": str(STANDINS), "TORCH_STANDIN_COMPILE_SECONDS": "0.3"},
        preflight={"gpus": [5]}, warmup={"gpus": [5], "command": job}, launch=launch)


def case_result(log: Path) -> dict:
    line = next(line for line in log.read_text().splitlines() if line.startswith('{"errors"'))
    return json.loads(line)


def status_json(lab: Lab) -> dict:
    done = gpuops("status", "-i", str(lab.inventory), "-t", "ct200", "--json")
    assert done.returncode == 0, said(done)
    target = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip().startswith("{") else {}
    return target


def run_of(status: dict) -> dict:
    return next(s["run"] for s in status["sessions"] if s["session"] == "train" and s["run"])


def test_compile_guard_true_guards_warmup_and_training_and_status_shows_its_counts(lab: Lab) -> None:
    result = lab.launch(guard_playbook(lab, True), "--detach")
    assert result.returncode == 0, said(result)
    run = lab.only_run()
    assert (run / "compile-guard").exists() and lab.meta(run)["compile_guard"] is True
    warm = case_result(run / "warmup-5.log")
    assert warm["guarded"] and warm["errors"] == [] and warm["torch"].endswith("+standin")  # PYTHONPATH kept
    wait_until(lambda: '{"errors"' in (run / "log").read_text(), message="training's first compiled calls")
    train = case_result(run / "log")
    assert train["guarded"] and train["errors"] == []

    def counted() -> dict | None:
        guard = run_of(status_json(lab)).get("compile_guard") or {}
        return guard if guard.get("processes") == 2 and guard.get("serialized") == 6 else None

    guard = wait_until(counted, timeout=30, message="status to show both processes' counts")
    assert guard["compiled"] == 6 and guard["waited_s"] > 0 and guard["unguarded"] == 0
    plain = gpuops("status", "-i", str(lab.inventory), "-t", "ct200")
    assert "compile guard: 6 first calls serialized" in plain.stdout and "2 processes" in plain.stdout, said(plain)
    (run / "go").touch()
    wait_until(lambda: (run / "exit_code").exists(), message="training to end")
    assert (run / "exit_code").read_text() == "0\n"


def test_without_the_key_the_same_job_hits_the_fx_race_and_status_shows_no_guard(lab: Lab) -> None:
    result = lab.launch(guard_playbook(lab, None), "--detach")
    assert result.returncode == 0, said(result)
    run = lab.only_run()
    assert not (run / "compile-guard").exists() and lab.meta(run)["compile_guard"] is False
    warm = case_result(run / "warmup-5.log")
    assert warm["guarded"] is False and warm["errors"] and all(e.startswith(FX) for e in warm["errors"])
    wait_until(lambda: '{"errors"' in (run / "log").read_text(), message="training's first compiled calls")
    assert run_of(status_json(lab))["compile_guard"] is None
    (run / "go").touch()
    wait_until(lambda: (run / "exit_code").exists(), message="training to end")


def _dflash(tmp_path: Path, guard: object) -> Path:
    pb = yaml.safe_load((REPO / "playbooks" / "dflash.yaml").read_text())
    pb["launch"]["compile_guard"] = guard
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump(pb, sort_keys=False))
    return path


def test_dry_run_shows_the_guard_in_what_prepare_gets(tmp_path: Path) -> None:
    inv = str(REPO / "inventories" / "example.yaml")
    on = gpuops("launch", "--dry-run", "-i", inv, "-p", str(_dflash(tmp_path, True)))
    assert on.returncode == 0, said(on)
    assert '"compile_guard":true' in on.stdout
    shutil.copy(REPO / "playbooks" / "dflash.yaml", tmp_path / "plain.yaml")
    off = gpuops("launch", "--dry-run", "-i", inv, "-p", str(tmp_path / "plain.yaml"))
    assert off.returncode == 0 and '"compile_guard":false' in off.stdout, said(off)


def test_a_value_that_is_not_true_or_false_is_refused_at_its_line(tmp_path: Path) -> None:
    pb = _dflash(tmp_path, "yes")
    done = gpuops("validate", "-i", str(REPO / "inventories" / "example.yaml"), "-p", str(pb))
    line = next(i for i, text in enumerate(pb.read_text().splitlines(), 1) if "compile_guard" in text)
    assert done.returncode == 2, said(done)
    assert f"{pb}:{line}:" in done.stderr and "expected true or false" in done.stderr
    assert "Traceback" not in done.stderr
