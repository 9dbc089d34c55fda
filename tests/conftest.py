"""Shared fixtures: a real sshd on 127.0.0.1 as the fake Proxmox host, its containers, the local twin.

Helpers live in tests/bench (importable as `bench` from any test module).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from bench import FakeProxmox, LocalEnv, SshServer
from bench.fakes import make_root


def _keep() -> bool:
    """GPUOPS_BENCH_KEEP=1 leaves fake roots on disk for a post-mortem."""
    return os.environ.get("GPUOPS_BENCH_KEEP") == "1"


def _server() -> Iterator[SshServer]:
    server = SshServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
        FakeProxmox(server.fake_root).cleanup()
        if not _keep():
            shutil.rmtree(server.fake_root, ignore_errors=True)


@pytest.fixture
def sshd() -> Iterator[SshServer]:
    """A fresh real sshd (fresh keys, fake root) per test; stopped and swept even when the test fails."""
    yield from _server()


@pytest.fixture
def bastion() -> Iterator[SshServer]:
    """A second real sshd on 127.0.0.1, used as the jump host."""
    yield from _server()


@pytest.fixture
def hop_b() -> Iterator[SshServer]:
    """A second jump host, for ProxyJump chains of two hops."""
    yield from _server()


@pytest.fixture
def fake_proxmox(sshd: SshServer) -> FakeProxmox:
    """The sshd's fake Proxmox host, with CT 200 (running, 8 GPUs) already created."""
    fake = FakeProxmox(sshd.fake_root)
    fake.add_container(200)
    return fake


@pytest.fixture
def local_proxmox(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProxmox]:
    """This process made the fake Proxmox host (no SSH): `pct` runs locally, CT 200 exists and runs.

    For PctTransport over a LocalTransport: the environment is what an SSH session there gets.
    """
    fake = FakeProxmox(make_root())
    fake.add_container(200)
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.delenv("TMUX_PANE", raising=False)
    for key, value in fake.env(None).items():
        monkeypatch.setenv(key, value)
    try:
        yield fake
    finally:
        fake.cleanup()
        if not _keep():
            shutil.rmtree(fake.root, ignore_errors=True)


@pytest.fixture
def local_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalEnv]:
    """For the local transport: stand-ins first on PATH, own HOME, own tmux server dir, fake GPUs.

    TMUX is unset so tmux honours TMUX_TMPDIR and never touches the developer's sessions.
    """
    env = LocalEnv(make_root("gpuops-local-"))
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.delenv("TMUX_PANE", raising=False)
    for key, value in env.environ().items():
        monkeypatch.setenv(key, value)
    try:
        yield env
    finally:
        env.cleanup()
        if not _keep():
            shutil.rmtree(env.root, ignore_errors=True)
