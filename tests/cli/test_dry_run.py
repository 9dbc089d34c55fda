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
from bench import FakeProxmox, LocalEnv, SshServer, jsoncheck, wait_until, write_inventory

REPO = Path(__file__).resolve().parents[2]
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
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "gpuops", *args],
        capture_output=True, text=True, env=full, cwd=REPO, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    jsoncheck.check(args, result.stdout)  # every --json line valid against `gpuops schema`
    return result


def steps(stdout: str) -> dict[str, str]:
    """The dry run's `# step` headers and the command printed under each (its `# stdin:` line apart)."""
    parts = STEP.split(stdout)[1:]
    return {name: text.rstrip("\n").split("\n# stdin: ")[0] for name, text in zip(parts[::2], parts[1::2], strict=True)}


def stdins(stdout: str) -> dict[str, str]:
    """What the dry run says goes on each step's stdin."""
    parts = STEP.split(stdout)[1:]
    return {name: text.rstrip("\n").split("\n# stdin: ", 1)[1]
            for name, text in zip(parts[::2], parts[1::2], strict=True) if "\n# stdin: " in text}


XIDS = "beside it, on the host: the Xids of its kernel log's last seconds"
HOST_WATCH = ("on the host, where it can read its kernel log: follow it for the run's GPUs (the spec on stdin; it reaches "
              "the run through the command in `link`)")
STEPS = ["copy gpuops' target files, only when the target lacks them", "preflight (lock + probe, one round trip)", XIDS,
         "create the run directory"]
LAST_STEPS = ["record the phase", "start the watchdog, then training in tmux", HOST_WATCH,
              "follow the log and the watchdog's events",
              "stop the run: a match or a stall while its watchdog is gone, or --timeout",
              "after a run its watchdog did not see end: reap leftover processes"]
#: The steps that run on the Proxmox host itself (its kernel log: docs/health.md), not in the container.
ON_HOST = (XIDS, HOST_WATCH)


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
    # The whole chain as ssh resolves it, each hop user@host:port (the jump's own user and port too).
    assert header == ("# gpuops launch --dry-run: target ct200 via ssh root@10.1.2.6:22 -J ops@10.1.2.5:22, "
                      "each line below sent as the remote command:")  # fmt: skip
    found = steps(result.stdout)
    names = list(found)
    assert names[:4] == STEPS
    drains = {gpu: f"after warmup GPU {gpu}: poll its memory until it drains" for gpu in (5, 6, 7)}
    for i, gpu in enumerate((5, 6, 7)):
        assert names[4 + 2 * i : 6 + 2 * i] == [f"warmup GPU {gpu}", drains[gpu]]
    assert names[10:] == LAST_STEPS
    for name, command in found.items():
        if name in ON_HOST:
            assert command.startswith("bash -c '"), (name, command)
        else:
            assert command.startswith("pct exec 200 -- bash -c '"), (name, command)
    assert found[XIDS].endswith(" gpuops xids 3600") and found[HOST_WATCH].endswith(" gpuops host-watch")
    link = json.loads(stdins(result.stdout)[HOST_WATCH])["link"]
    assert link[:5] == ["pct", "exec", "200", "--", "bash"] and link[-2:] == ["host-link", "<run-id>"]
    for gpu in (5, 6, 7):
        warm = found[f"warmup GPU {gpu}"]
        assert warm.endswith(f" gpuops <run-id> {gpu} 'python /root/warmup_drafter.py --device cuda:{gpu}'")
        assert 'exec bash "$L/gpuops_agent/sh/warmup.sh" "$@"' in warm
        query = f"nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits -i {gpu}"
        assert found[drains[gpu]] == f"pct exec 200 -- bash -c '{query}'"
    spec = json.loads(stdins(result.stdout)["create the run directory"])
    assert spec["command"] == "bash /root/start_training.sh" and spec["workdir"] == "/root"
    assert spec["watch"]["rules"] == [{"name": "loss-nan", "pattern": r"loss (nan|inf)\b", "action": "abort"}]
    assert spec["watch"]["abort"] == {"signal": "INT", "grace": 30.0} and spec["watch"]["gpus"] == [5, 6, 7]
    assert spec["meta"]["phase"] == "warmup" and "CUDA_VISIBLE_DEVICES" not in spec["env"]
    assert found["start the watchdog, then training in tmux"].endswith(" gpuops start <run-id>")
    assert '"phase":"running"' in stdins(result.stdout)["record the phase"]
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
    assert all(ev["command"].startswith("pct exec 200 -- ") for ev in events[:-1] if ev["step"] not in ON_HOST)
    summary = events[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"]) == ("summary", "dry-run", 0)
    text_out = gpuops("launch", "--dry-run", "-i", str(EXAMPLE_INV), "-p", str(DFLASH), prefix=no_network()).stdout
    text = steps(text_out)
    assert [ev["step"] for ev in events[:-1]] == list(text)
    with_meta = ("create the run directory", "record the phase")  # they name the launcher's pid
    assert {ev["step"]: ev["stdin"] for ev in events if "stdin" in ev and ev["step"] not in with_meta} == {
        name: data for name, data in stdins(text_out).items() if name not in with_meta}
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
    assert json.loads(stdins(result.stdout)["create the run directory"])["workdir"] == str(REPO / "playbooks")
    assert "demo_trainer.py warmup --gpu 1" in found["warmup GPU 1"]
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
    assert f"via ssh {sshd.user}@127.0.0.1:{sshd.port}," in gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb)).stdout
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
    spec = json.loads(stdins(text.stdout)["create the run directory"])
    for name in values:
        assert f"export {name}=***\n" in spec["env"]
    assert "export PLAIN=shown-as-is\n" in spec["env"]
    assert spec["meta"]["env"] == dict.fromkeys(values, "***") | {"PLAIN": "shown-as-is"}
    assert sshd.connection_count() == 0


def test_a_secret_with_a_quote_written_into_a_command_is_masked_where_quoting_respells_it(
        lab: tuple[SshServer, FakeProxmox, Path], tmp_path: Path) -> None:
    secret = "hf_Q'uote9876"
    pb = write_playbook(tmp_path / "pb.yaml", env={"HF_TOKEN": secret},
                        warmup={"gpus": [5], "command": f"login --token {secret} && warm {{gpu}}"},
                        launch={"session": "train", "command": f"train --token {secret}"})
    for extra in ((), ("--json",)):
        result = gpuops("launch", "--dry-run", *extra, "-i", str(lab[2]), "-p", str(pb))
        assert result.returncode == 0, result.stderr
        shown = result.stdout.replace("'\"'\"'", "'").replace("\\", "")  # undo the quoting of every layer
        for i in range(len(secret) - 7):
            assert secret[i : i + 8] not in shown, secret[i : i + 8]
        assert "train --token ***" in shown and "login --token *** && warm 5" in shown


# -- the printed command is the command -------------------------------------------------------------
def hostile(canary: Path) -> str:
    return f"it's \"quoted\" $(touch {canary}) `touch {canary}` $HOME ${{PATH}} back\\slash\nline two\ttab ünï %s *"


def test_printed_commands_run_as_printed_through_both_shell_layers(
    lab: tuple[SshServer, FakeProxmox, Path], tmp_path: Path
) -> None:
    """Send the printed commands (and their printed stdin) with the real ssh client: the host's login
    shell, then bash -c in the CT. A hostile env value and command arrive as they were written."""
    from gpuops.client.door.bundle import bundle

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
    data = {name: text.replace("<run-id>", run_id) for name, text in stdins(result.stdout).items()}

    def send(name: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        sent = subprocess.run(sshd.ssh_argv() + [found[name]], input=stdin, capture_output=True, timeout=60)
        assert sent.returncode == 0, (name, sent.stderr)
        return sent

    send(STEPS[0], bundle().zip)
    lock = send(STEPS[1]).stdout.decode()  # stdin empty: the lock is taken, the probe printed, the lock let go
    assert "@@gpuops gpus\n" in lock and "@@gpuops locked-ok\n" in lock
    assert found[XIDS].startswith("bash -c '")  # on the host (its files copied there when it lacks them)
    send(STEPS[3], data[STEPS[3]].encode())
    assert send("warmup GPU 5").stdout.decode() == value + "\ngpu=5\n"
    send("record the phase", data["record the phase"].encode())
    assert "@@gpuops started" in send("start the watchdog, then training in tmux").stdout.decode()
    run = fake.home(CT) / ".gpuops" / "runs" / run_id
    assert (run / "warmup-5.log").read_text() == value + "\ngpu=5\n"
    wait_until(lambda: (run / "exit_code").exists(), message="the started run to finish")
    assert (run / "exit_code").read_text() == "0\n"
    assert (run / "log").read_bytes() == (value + "\n").encode()
    assert json.loads((run / "meta.json").read_text())["env"] == {"HOSTILE": value}
    assert not canary.exists()
    drain = send("after warmup GPU 5: poll its memory until it drains")
    assert drain.stdout.decode() == "5, 0, 0\n"
