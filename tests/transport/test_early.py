"""Work started before it is needed (transport/early.py): `gpuops status` resolves and connects its host while
it is still importing. Its first user must see exactly what it would have seen had it made the call itself:
the answer, or the error, once; a command that ends first leaves no connection behind.

The resolution tests run the real `ssh -G` behind a wrapper on PATH that counts its calls.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
from pathlib import Path

import pytest
from bench import FakeProxmox, SshServer, wait_until, write_inventory
from bench.cli import Running
from bench.inventory import silent_host

from gpuops.errors import UsageError
from gpuops.targets import Host
from gpuops.transport.ssh import resolve as sshresolve
from gpuops.transport.ssh.head_start import Early


class Conn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_the_first_user_gets_the_answer_or_the_error_the_call_made() -> None:
    conn = Conn()
    assert Early(lambda: conn, close=Conn.close).result() is conn

    def refused() -> None:
        raise ConnectionRefusedError("refused")

    with pytest.raises(ConnectionRefusedError, match="refused"):
        Early(refused).result()


def test_an_answer_nobody_will_use_is_closed_when_it_comes() -> None:
    gate = threading.Event()
    late = Conn()

    def slow() -> Conn:
        gate.wait(30)
        return late

    early = Early(slow, close=Conn.close)
    early.discard()  # the command ended (Ctrl-C) while the connect was still out
    gate.set()
    wait_until(lambda: late.closed, timeout=30, message="the late connection closed")

    made = Conn()
    early = Early(lambda: made, close=Conn.close)
    wait_until(lambda: early._done.is_set(), timeout=30, message="the call ended")
    early.discard()
    assert made.closed


@pytest.fixture
def counted_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`ssh` on PATH: the real one, each call's arguments appended to a log first."""
    real = shutil.which("ssh")
    if real is None:
        pytest.skip("needs OpenSSH's ssh client")
    log = tmp_path / "ssh-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh/config: only the host's own options
    return log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_resolution_started_early_is_the_one_the_connect_uses(counted_ssh: Path) -> None:
    host = Host(name="pve-early", address="198.51.100.7", user="ops", port=2222)
    sshresolve.resolve_soon(host)
    found = sshresolve.resolve("198.51.100.7", sshresolve.explicit_args(host))
    assert (found.hostname, found.user, found.port) == ("198.51.100.7", "ops", 2222)
    assert len(calls(counted_ssh)) == 1  # one `ssh -G`, not one early and one when it was needed
    sshresolve.resolve("198.51.100.7", sshresolve.explicit_args(host))
    assert len(calls(counted_ssh)) == 1  # and cached for the command, as before


def test_an_early_resolution_that_failed_is_said_once_then_asked_again(counted_ssh: Path) -> None:
    host = Host(name="pve-bad", address="198.51.100.8", ssh_args=("-o", "NoSuchOption=1"))
    args = sshresolve.explicit_args(host)
    sshresolve.resolve_soon(host)
    with pytest.raises(UsageError, match="ssh cannot read its configuration for 198.51.100.8"):
        sshresolve.resolve("198.51.100.8", args)
    with pytest.raises(UsageError, match="ssh cannot read its configuration"):
        sshresolve.resolve("198.51.100.8", args)  # not an answer kept: ssh is asked again (the file may be fixed)
    assert len(calls(counted_ssh)) == 2


def _established_to(port: int) -> bool:
    """A TCP connection to 127.0.0.1:port is up (the kernel accepted it; the frozen sshd never answers)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def test_ctrl_c_while_the_early_connect_waits_on_a_silent_host_ends_status_at_once(
        tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    with silent_host(tmp_path / "inv.yaml", sshd, connect_timeout=120) as (inv, hole):
        status = Running("status", "-i", str(inv), "-t", "ct300")
        status.wait_for(lambda: _established_to(hole.port), "gpuops connected to the silent host")
        status.signal(signal.SIGINT)
        # Well inside the 120 s handshake timeout: the connect running in the background holds nothing up.
        result = status.finish(timeout=60)
    assert result.code == 130, result
    assert "interrupted" in result.err and "Traceback" not in result.err


def test_status_of_two_containers_on_one_host_makes_one_connection(tmp_path: Path, sshd: SshServer,
                                                                    fake_proxmox: FakeProxmox) -> None:
    # The early connect and both targets' probes (two threads asking at once) share one SSH connection.
    fake_proxmox.add_container(200)
    fake_proxmox.add_container(201)
    inv = write_inventory(tmp_path / "inv.yaml", sshd, extra_targets={"ct201": {"host": "pve1", "ctid": 201}})
    before = sshd.connection_count()
    status = Running("status", "-i", str(inv), "--all")
    result = status.finish(timeout=120)
    assert result.code == 0, result
    assert "ct200: reachable via pve1" in result.text and "ct201: reachable via pve1" in result.text
    assert sshd.connection_count() == before + 1
