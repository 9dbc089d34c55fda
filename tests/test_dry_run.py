"""`gpuops launch --dry-run`: every command a launch would send, quoted exactly, and nothing sent.

The shipped example (a real lab's 10.1.2.6) is only ever dry-run, inside a network namespace with no
network at all when the machine allows it. Against the bench sshd, a dry run makes no connection and
leaves no file; and the commands it prints, sent as they are by the real OpenSSH client, do the launch's
work with every hostile value arriving intact: the printed quoting is the quoting that is used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import FakeProxmox, LocalEnv, SshServer, wait_until, write_inventory

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_INV = REPO / "inventories" / "example.yaml"
DFLASH = REPO / "playbooks" / "dflash.yaml"
LOCAL_INV = REPO / "inventories" / "local.yaml"
DEMO = REPO / "playbooks" / "demo.yaml"
GPUOPS_VARS = ("GPUOPS_INVENTORY", "GPUOPS_PLAYBOOK", "GPUOPS_TARGET")
STEP = re.compile(r"\n\n# ([^\n]+)\n")  # a blank line, then `# step name`, then its command
CT = 200


def gpuops(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would; the developer's own GPUOPS_* variables never leak in."""
    full = {k: v for k, v in os.environ.items() if k not in GPUOPS_VARS}
    full.update(env or {})
    return subprocess.run(
        [*prefix, sys.executable, "-m", "gpuops", *args],
        capture_output=True, text=True, env=full, cwd=REPO, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def steps(stdout: str) -> dict[str, str]:
    """The dry run's `# step` headers and the command printed under each."""
    parts = STEP.split(stdout)[1:]
    return {name: text.rstrip("\n") for name, text in zip(parts[::2], parts[1::2])}


def no_network() -> tuple[str, ...]:
    """A prefix that runs the command with no network at all (a new, empty network namespace), if allowed."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=30).returncode == 0:
        return (unshare, "-n")
    return ()


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and mtime: a snapshot to compare."""
    out = {}
    for path in sorted(root.rglob("*")):
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


# -- the shipped files ------------------------------------------------------------------------------
def test_example_inventory_and_dflash_playbook_print_every_pct_exec_command() -> None:
    prefix = no_network()
    result = gpuops("launch", "--dry-run", "-i", str(EXAMPLE_INV), "-p", str(DFLASH), prefix=prefix)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    header = result.stdout.splitlines()[0]
    assert header == ("# gpuops launch --dry-run: target ct200 via ssh root@10.1.2.6 -p 22 -J bastion, "
                      "each line below sent as the remote command:")  # fmt: skip
    found = steps(result.stdout)
    names = list(found)
    assert names[:2] == ["preflight (lock + probe, one round trip)", "create the run directory"]
    warmups = [n for n in names if n.startswith("warmup GPU")]
    assert warmups == ["warmup GPU 5", "warmup GPU 6", "warmup GPU 7"]
    drains = {gpu: f"after warmup GPU {gpu}: poll its memory until it drains" for gpu in (5, 6, 7)}
    for i, gpu in enumerate((5, 6, 7)):
        assert names[2 + 2 * i : 4 + 2 * i] == [f"warmup GPU {gpu}", drains[gpu]]
    assert names[8:] == ["start in tmux", "follow the log", "on a match or stall: abort", "after the run: reap leftover processes",
                         "if a warmup fails: reap its processes as above, then record it"]
    for name, command in found.items():
        assert command.startswith("pct exec 200 -- bash -c '"), (name, command)
    for gpu in (5, 6, 7):
        warm = found[f"warmup GPU {gpu}"]
        assert f"python /root/warmup_drafter.py --device cuda:{gpu}" in warm
        assert f"export GPUOPS_GPU={gpu}\n" in warm and "cd -- /root || exit 126" in warm
        assert "CUDA_VISIBLE_DEVICES" not in warm
        query = f"nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -i {gpu}"
        assert found[drains[gpu]] == f"pct exec 200 -- bash -c '{query}'"
    assert "bash /root/start_training.sh" in found["start in tmux"]
    assert "tmux new-session -d -s dflash-train" in found["start in tmux"]
    assert "tmux send-keys -t =dflash-train: C-c" in found["on a match or stall: abort"]
    failed = found["if a warmup fails: reap its processes as above, then record it"]
    assert '"phase":"warmup-failed"' in failed and '.gpuops/runs/<run-id>"' in failed and "meta.json" in failed
    assert result.stderr == ""


def test_example_dry_run_as_json_lines(tmp_path: Path) -> None:
    result = gpuops("launch", "--dry-run", "--json", "-i", str(EXAMPLE_INV), "-p", str(DFLASH), prefix=no_network())
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    for ev in events:
        assert {"ts", "event", "target"} <= set(ev) and ev["target"] == "ct200", ev
        assert ev["ts"].endswith("Z")
    assert {ev["event"] for ev in events[:-1]} == {"dry_run_step"}
    assert [ev["step"] for ev in events if ev.get("step", "").startswith("warmup GPU")] == [
        "warmup GPU 5", "warmup GPU 6", "warmup GPU 7",
    ]  # fmt: skip
    assert all(ev["command"].startswith("pct exec 200 -- ") for ev in events[:-1])
    summary = events[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"]) == ("summary", "dry-run", 0)
    text = steps(gpuops("launch", "--dry-run", "-i", str(EXAMPLE_INV), "-p", str(DFLASH), prefix=no_network()).stdout)
    assert [ev["step"] for ev in events[:-1]] == list(text)
    assert {ev["step"]: ev["command"] for ev in events if "warmup GPU" in ev.get("step", "")} == {
        name: command for name, command in text.items() if "warmup GPU" in name
    }


def test_local_demo_dry_run_runs_commands_here_from_the_playbook_folder(local_env: LocalEnv) -> None:
    result = gpuops("launch", "--dry-run", "-i", str(LOCAL_INV), "-p", str(DEMO))
    assert result.returncode == 0, result.stderr
    assert "via this machine (local)" in result.stdout.splitlines()[0]
    found = steps(result.stdout)
    assert all(command.startswith("bash -c ") for command in found.values()), found
    assert "pct exec" not in result.stdout
    assert f"cd -- {REPO / 'playbooks'} || exit 126" in found["warmup GPU 0"]
    assert "python3 -m gpuops.demo warmup --gpu 1" in found["warmup GPU 1"]
    assert not (local_env.home / ".gpuops").exists()
    assert local_env.processes() == []  # not even a tmux server was started


# -- nothing sent -----------------------------------------------------------------------------------
@pytest.fixture
def lab(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> tuple[SshServer, FakeProxmox, Path]:
    return sshd, fake_proxmox, write_inventory(tmp_path / "inventory.yaml", sshd)


def write_playbook(path: Path, **changes: Any) -> Path:
    pb: dict[str, Any] = {
        "name": "dry",
        "target": "ct200",
        "preflight": {"gpus": [5, 6, 7]},
        "warmup": {"gpus": [5, 6, 7], "command": "fake-warmup --gpu {gpu} --duration 0.1 --steps 1"},
        "launch": {"session": "train", "command": "fake-train --mode steps --steps 2"},
    }
    pb.update(changes)
    path.write_text(yaml.safe_dump(pb, sort_keys=False))
    return path


def test_dry_run_connects_to_nothing_and_creates_nothing(lab: tuple[SshServer, FakeProxmox, Path], tmp_path: Path) -> None:
    sshd, fake, inv = lab
    pb = write_playbook(tmp_path / "pb.yaml")
    before = tree(fake.root)
    local_before = tree(tmp_path)
    for extra in ((), ("--json",)):
        result = gpuops("launch", "--dry-run", *extra, "-i", str(inv), "-p", str(pb))
        assert result.returncode == 0, result.stderr
        assert "pct exec 200 -- bash -c" in result.stdout
    assert f"via ssh {sshd.user}@127.0.0.1 -p {sshd.port}," in gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb)).stdout
    assert sshd.connection_count() == 0
    assert tree(fake.root) == before  # no run dir, no lock, no session file, no warmup log
    assert tree(tmp_path) == local_before
    assert fake.processes(CT) == [] and fake.processes(None) == []


def test_dry_run_masks_secrets(lab: tuple[SshServer, FakeProxmox, Path], tmp_path: Path) -> None:
    sshd, _, inv = lab
    values = {
        "HF_TOKEN": "hf-by-name-0123456789",          # secret by its name
        "OPAQUE": "listed-in-secrets-0123456789",     # secret by the secrets: list
        "INLINE": "marked-inline-0123456789",         # {value: ..., secret: true}
        "FROM_ENV": "from-my-environment-0123456789",  # {from_env: ..., secret: true}
    }
    pb = write_playbook(
        tmp_path / "pb.yaml",
        env={
            "HF_TOKEN": values["HF_TOKEN"],
            "OPAQUE": values["OPAQUE"],
            "INLINE": {"value": values["INLINE"], "secret": True},
            "FROM_ENV": {"from_env": "GPUOPS_TEST_LOCAL_SECRET", "secret": True},
            "PLAIN": "shown-as-is",
        },
        secrets=["OPAQUE"],
    )
    env = {"GPUOPS_TEST_LOCAL_SECRET": values["FROM_ENV"]}
    text = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb), env=env)
    as_json = gpuops("launch", "--dry-run", "--json", "-i", str(inv), "-p", str(pb), env=env)
    for result in (text, as_json):
        assert result.returncode == 0, result.stderr
        for value in values.values():
            assert value not in result.stdout and value not in result.stderr
    warm = steps(text.stdout)["warmup GPU 5"]
    for name in values:
        assert f"export {name}=***\n" in warm
    assert "export PLAIN=shown-as-is\n" in warm
    meta = re.search(r"'\"'\"'(\{\"command\".*?\})'\"'\"' >\"\$D/meta.json\"", steps(text.stdout)["create the run directory"])
    assert meta, steps(text.stdout)["create the run directory"]
    assert json.loads(meta.group(1))["env"] == {name: "***" for name in values} | {"PLAIN": "shown-as-is"}
    assert sshd.connection_count() == 0


# -- the printed command is the command -------------------------------------------------------------
def hostile(canary: Path) -> str:
    return f"it's \"quoted\" $(touch {canary}) `touch {canary}` $HOME ${{PATH}} back\\slash\nline two\ttab ünï %s *"


def test_printed_commands_run_as_printed_through_both_shell_layers(
    lab: tuple[SshServer, FakeProxmox, Path], tmp_path: Path
) -> None:
    """Send the printed commands with the real ssh client: the host's login shell, then bash -c in the CT."""
    sshd, fake, inv = lab
    canary = tmp_path / "canary"
    value = hostile(canary)
    pb = write_playbook(
        tmp_path / "pb.yaml",
        env={"HOSTILE": value},
        warmup={"gpus": [5], "command": "printenv HOSTILE; echo gpu={gpu}"},
        launch={"session": "train", "command": "printenv HOSTILE"},
    )
    result = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb))
    assert result.returncode == 0, result.stderr
    run_id = "20261129-101500-abcdef"
    found = {name: command.replace("<run-id>", run_id) for name, command in steps(result.stdout).items()}
    for name in ("preflight (lock + probe, one round trip)", "create the run directory", "warmup GPU 5", "start in tmux"):
        sent = sshd.ssh(found[name])  # stdin is empty: the lock is taken, the probe printed, the lock let go
        assert sent.returncode == 0, (name, sent.stderr)
        if name.startswith("preflight"):
            assert "@@gpuops gpus\n" in sent.stdout and sent.stdout.endswith("@@gpuops locked\n")
        if name == "warmup GPU 5":
            assert sent.stdout == value + "\ngpu=5\n"
    run = fake.home(CT) / ".gpuops" / "runs" / run_id
    assert (run / "warmup-5.log").read_text() == value + "\ngpu=5\n"
    wait_until(lambda: (run / "exit_code").exists(), message="the started run to finish")
    assert (run / "exit_code").read_text() == "0\n"
    assert (run / "log").read_bytes() == (value + "\n").encode()
    assert json.loads((run / "meta.json").read_text())["env"] == {"HOSTILE": value}
    assert not canary.exists()
    drain = sshd.ssh(found["after warmup GPU 5: poll its memory until it drains"])
    assert (drain.returncode, drain.stdout) == (0, "5, 0\n")
