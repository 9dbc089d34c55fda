"""Interrupts (issue 19, item 11): Ctrl-C forwarded twice (as a CI runner's `timeout` does) to a
3-target launch mid-warmup, over the real-sshd bench. gpuops exits 130 saying the warmup was stopped
only once every target's warmup is ended, and no launch lock holder is left behind."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, SshServer, wait_until, write_inventory
from bench.cli import Running
from test_launch import cmdline

CTS = (200, 201, 202)


@pytest.fixture
def three(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> tuple[FakeProxmox, Path, Path]:
    for vmid in CTS[1:]:
        fake_proxmox.add_container(vmid)
    inventory = write_inventory(tmp_path / "inventory.yaml", sshd,
                                extra_targets={f"ct{v}": {"host": "pve1", "ctid": v, "gpus": list(range(8))} for v in CTS[1:]})
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(yaml.safe_dump({
        "name": "interrupted", "preflight": {"gpus": [5]},
        "warmup": {"gpus": [5], "command": "fake-warmup --gpu {gpu} --duration 60 --steps 60"},
        "launch": {"session": "train", "command": "true"}, "watch": {"stall_timeout": 0}}))
    return fake_proxmox, inventory, playbook


def left(fake: FakeProxmox, needle: str) -> list[int]:
    return [pid for vmid in CTS for pid in fake.processes(vmid) if needle in cmdline(pid)]


def warming(fake: FakeProxmox) -> bool:
    return all(fake.warmup_log(v).exists() and "start" in fake.warmup_log(v).read_text() for v in CTS)


@pytest.mark.parametrize("gap", [0.0, 0.3])
def test_ctrl_c_twice_mid_warmup_ends_every_targets_warmup_before_exit(three, gap: float) -> None:
    fake, inventory, playbook = three
    targets = [a for v in CTS for a in ("-t", f"ct{v}")]
    launch = Running("launch", "-i", str(inventory), "-p", str(playbook), *targets, "--yes")
    launch.wait_for(lambda: warming(fake), "the three warmups to start", timeout=90)
    launch.signal(signal.SIGINT)
    time.sleep(gap)  # the second Ctrl-C of a `timeout` that forwards its signal twice, at once or a moment later
    launch.signal(signal.SIGINT)
    result = launch.finish(timeout=120)
    assert result.code == 130, result
    assert "EOFError" not in result.err, result
    assert result.err.count("the warmup was stopped") == 3, result
    assert left(fake, "fake-warmup") == [], "a warmup runs on after gpuops said it was stopped"
    assert left(fake, "lock.sh") == [], "a launch lock holder was left behind"
    # The next launch finds the targets free.
    wait_until(lambda: not left(fake, "gpuops"), timeout=30, message="nothing of the launch to be left")
