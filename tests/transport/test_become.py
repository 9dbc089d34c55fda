"""transport/become.py: the job runs as the target's become user, one prefix around every command.

Rendered: exactly what each shape sends (runuser in a container, sudo -H -n or su on a host), user data
quoted once per layer. Real: a second local user (created here when the tests run as root, removed after)
runs a command through `runuser` in the fake container and `su` on this machine; and a detached launch over
the real sshd into the fake container leaves its run files under that user's home and its training owned
by that user.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, SshServer
from bench.cli import gpuops
from bench.inventory import write_inventory
from bench.waiting import wait_until

from gpuops.command import Cmd, Script, bash
from gpuops.config import load_inventory
from gpuops.targets import Host, Inventory, Target
from gpuops.transport import dry_transport
from gpuops.transport.become import BecomeTransport
from gpuops.transport.local import LocalTransport
from gpuops.transport.pct import PctTransport

NEEDS_A_USER = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None,
                                  reason="a second real user needs root, useradd and runuser")


def inventory(**target: object) -> Inventory:
    host = Host(name="pve1", address="10.1.2.6", user="root")
    t = Target(name="ct200", host="pve1", **target)  # type: ignore[arg-type]
    return Inventory(path="/inv.yml", hosts={"pve1": host}, targets={"ct200": t})


TRICKY = bash(Script("echo \"$HOME\" 'it''s' ; id -un"))


@pytest.mark.parametrize(("target", "sent"), [
    ({"ctid": 200, "become_user": "alice"},
     "pct exec 200 -- runuser -u alice -- bash -c " + shlex.quote(TRICKY.argv[2].render())),
    ({"ctid": 200, "become_user": "root"}, "pct exec 200 -- bash -c " + shlex.quote(TRICKY.argv[2].render())),
    ({"ctid": 200}, "pct exec 200 -- bash -c " + shlex.quote(TRICKY.argv[2].render())),
    ({"become_user": "alice"}, "sudo -H -n -u alice -- bash -c " + shlex.quote(TRICKY.argv[2].render())),
    ({"become_user": "alice", "become_method": "su"},
     "su -s /bin/bash -c " + shlex.quote(TRICKY.render()) + " alice"),
])  # fmt: skip
def test_each_shape_sends_its_prefix_and_quotes_once_per_layer(target: dict, sent: str) -> None:
    inv = inventory(**target)
    transport = dry_transport(inv, inv.targets["ct200"])
    assert transport.render(TRICKY) == sent
    # What the host's login shell reads back is the argv the container (or sudo, su) gets: su's -c
    # word is the whole command as one more shell layer, the others pass the argv on untouched.
    words = shlex.split(sent)
    if "su" in words[:1]:
        assert shlex.split(words[4]) == TRICKY.words()
    else:
        assert words[-3:] == TRICKY.words()


def test_the_container_questions_run_as_the_user_too() -> None:
    inv = inventory(ctid=200, become_user="alice")
    transport = dry_transport(inv, inv.targets["ct200"])
    assert isinstance(transport, BecomeTransport) and transport.container is not None
    assert transport.container.ctid == 200
    assert transport.wrap(Cmd("true")).render() == "pct exec 200 -- runuser -u alice -- true"


# -- a real second user ---------------------------------------------------------------------------


@dataclass
class User:
    name: str
    home: Path
    uid: int


@pytest.fixture
def second_user(tmp_path_factory: pytest.TempPathFactory) -> Iterator[User]:
    """A real user (unique per test process), its home made here; removed after, whatever the test did."""
    name = f"gpob{os.getpid()}"
    home = Path("/tmp") / f"gpuops-home-{name}"
    subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/bash", name], check=True, capture_output=True)
    try:
        home.mkdir(mode=0o750)
        uid = pwd.getpwnam(name).pw_uid
        os.chown(home, uid, pwd.getpwnam(name).pw_gid)
        yield User(name, home, uid)
    finally:
        kill_processes_of(pwd.getpwnam(name).pw_uid)
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def kill_processes_of(uid: int) -> None:
    """End what the user created here still runs (a failed test's training), each by its pid."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def open_container_to(fake: FakeProxmox, vmid: int, user: User) -> Path:
    """What a real container gives every user: /tmp (here the stand-in's TMUX_TMPDIR) is 1777, the GPU
    device nodes rw for all, the path to them traversable; the user's home is its own (returned)."""
    ct = fake.ct_dir(vmid)
    for folder in (fake.root, fake.root / "ct", ct):
        folder.chmod(folder.stat().st_mode | 0o711)
    (ct / "tmux").chmod(0o1777)
    for path in [ct / "gpus", *(ct / "gpus").rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o666)
    return user.home


@NEEDS_A_USER
def test_runuser_in_the_container_and_su_on_this_machine_run_as_the_user(
    local_proxmox: FakeProxmox, second_user: User
) -> None:
    open_container_to(local_proxmox, 200, second_user)
    ask = bash(Script('printf "%s %s %s\\n" "$(id -un)" "$HOME" "$GPUOPS_FAKE_CT"'))
    in_ct = BecomeTransport(PctTransport(LocalTransport(), 200), second_user.name)
    done = in_ct.run(ask, timeout=30)
    assert (done.exit_code, done.out.split()) == (0, [second_user.name, str(second_user.home), "200"]), done
    on_host = BecomeTransport(LocalTransport(), second_user.name, "su")
    done = on_host.run(ask, timeout=30)
    assert (done.exit_code, done.out.split()[:2]) == (0, [second_user.name, str(second_user.home)]), done
    # The container's own questions come back through the same prefix.
    assert in_ct.container is not None
    result, state = in_ct.container.run_with_state(Cmd("id", "-un"), timeout=30)
    assert (result.out.strip(), state) == (second_user.name, "running")


@NEEDS_A_USER
def test_a_become_user_targets_run_lives_in_that_users_home_and_its_training_is_that_users(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, second_user: User
) -> None:
    home = open_container_to(fake_proxmox, 200, second_user)
    inv = write_inventory(tmp_path / "inv.yaml", sshd, gpus=range(8))
    data = yaml.safe_load(inv.read_text())
    data["targets"]["ct200"]["become_user"] = second_user.name
    inv.write_text(yaml.safe_dump(data))
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "as-user", "preflight": {"gpus": [5]}, "workdir": str(home),
                                  "launch": {"session": "asuser", "command": "fake-train --mode steps --steps 100000 "
                                             "--gpus 5 --interval 0.1"}}))
    args = ["-i", str(inv), "-p", str(pb), "-t", "ct200"]
    validated = gpuops("validate", *args, "--json")
    assert validated.code == 0, validated
    view = next(t for t in validated.events()[-1]["targets"] if t["name"] == "ct200")
    assert (view["become_user"], view["become_method"]) == (second_user.name, "runuser"), view
    started = gpuops("launch", "--detach", "--yes", *args)
    assert started.code == 0, started
    try:
        runs = home / ".gpuops" / "runs"
        wait_until(lambda: runs.is_dir() and any(runs.iterdir()), timeout=30, message="the run's folder")
        run_dir = next(runs.iterdir())
        assert run_dir.stat().st_uid == second_user.uid
        assert not (fake_proxmox.home(200) / ".gpuops" / "runs").exists()  # nothing under root's home
        trainers = lambda: [p for p in fake_proxmox.processes(200)  # noqa: E731
                            if b"fake-train" in Path(f"/proc/{p}/cmdline").read_bytes()]
        wait_until(trainers, timeout=30, message="the training to start")
        assert {os.stat(f"/proc/{p}").st_uid for p in trainers()} == {second_user.uid}
        status = gpuops("status", *args)
        assert status.code == 0 and "running" in status.text, status
    finally:
        stopped = gpuops("stop", *args)
    assert stopped.code == 0, stopped


def test_launch_dry_run_shows_every_command_as_the_user(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text("hosts: {pve1: {address: 10.1.2.6, user: root}}\n"
                   "targets: {ct200: {host: pve1, ctid: 200, become_user: alice}}\n")
    pb = tmp_path / "pb.yaml"
    pb.write_text("launch: {session: s, command: train}\n")
    planned = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb), "-t", "ct200")
    assert planned.code == 0, planned
    sent = [line for line in planned.text.splitlines() if line.startswith("pct exec")]
    assert sent and all(line.startswith("pct exec 200 -- runuser -u alice -- ") for line in sent), sent
    assert load_inventory(str(inv)).targets["ct200"].become_user == "alice"
