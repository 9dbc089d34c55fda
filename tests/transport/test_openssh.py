"""The user's own `ssh` carries gpuops' connections (transport/ssh/openssh/openssh.py): their ControlMaster, an IdentityAgent,
a certificate, the user's ProxyCommand, gpuops' own master reused by the next command, ssh's 255 told from the command's, a closed port
said at once, and UserKnownHostsFile / Include paths with spaces (issue 29 item 9).

Real sshd on 127.0.0.1 (the bench); every ~/.ssh/config is the test's own (HOME rehomed), no ssh-agent of the
developer's is reachable (SSH_AUTH_SOCK emptied).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from bench import FakeProxmox, SshServer, wait_until, write_inventory
from bench.cli import gpuops

from gpuops.command import Cmd
from gpuops.config import load_inventory
from gpuops.errors import ConnectError
from gpuops.transport import Pool
from gpuops.transport.ssh.connecting import ConnectionLost

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A short private XDG_RUNTIME_DIR: where gpuops puts its masters' sockets."""
    folder = Path(tempfile.mkdtemp(prefix="gr-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def home_with(tmp_path: Path, config: str) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "config").write_text(config)
    return home


def alias_inventory(tmp_path: Path, sshd: SshServer, **host: Any) -> Path:
    inv = tmp_path / "inv.yaml"
    entry = {"address": "pve-alias", "known_hosts": str(sshd.known_hosts), **host}
    inv.write_text(yaml.safe_dump({"hosts": {"pve1": {k: v for k, v in entry.items() if v is not None}},
                                   "targets": {"ct200": {"host": "pve1", "ctid": 200}}}))
    return inv


def env_of(home: Path, runtime: Path | None = None) -> dict[str, str]:
    env = {"HOME": str(home), "SSH_AUTH_SOCK": ""}
    return {**env, "XDG_RUNTIME_DIR": str(runtime)} if runtime else env


def alias(sshd: SshServer, *lines: str) -> str:
    return "\n  ".join([f"Host pve-alias\n  HostName {sshd.host}", f"Port {sshd.port}", f"User {sshd.user}", *lines]) + "\n"


# -- ControlMasters -------------------------------------------------------------------------------


def test_a_controlmaster_the_user_opened_serves_every_status(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox,
                                                             runtime: Path) -> None:
    sock = tmp_path / "user-cm"
    home = home_with(tmp_path, alias(sshd, f"IdentityFile {sshd.client_key}", f"ControlPath {sock}",
                                     f"UserKnownHostsFile {sshd.known_hosts}"))
    opened = subprocess.run(["ssh", "-F", str(home / ".ssh" / "config"), "-o", "BatchMode=yes", "-M", "-S", str(sock),
                             "-fN", "pve-alias"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert opened.returncode == 0, opened.stderr
    try:
        assert sshd.connection_count() == 1
        inv = alias_inventory(tmp_path, sshd)
        for _ in range(2):
            result = gpuops("status", "-v", "-i", str(inv), env=env_of(home, runtime))
            assert result.code == 0, result
            assert "ct200: reachable via pve1, container 200 running" in result.text
            assert "gpuops: 0 SSH connection(s)" in result.err
        assert sshd.connection_count() == 1  # no login of gpuops' own: the user's master carried both
        assert not list((runtime / "gpuops" / "cm").glob("[0-9a-f]" * 20))  # and gpuops made no master beside it
    finally:
        subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "pve-alias"], capture_output=True, timeout=30)


def test_a_lax_master_of_the_users_is_no_way_around_the_known_hosts_the_inventory_pins(
        tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, runtime: Path) -> None:
    """Issue 35 item 11: the user's config checks no host key (StrictHostKeyChecking no) and their master to the
    host is open, while the host's key is not the one the inventory's known_hosts pins (a man in the middle):
    gpuops makes its own connection, checked against that file, and refuses the changed key (exit 3)."""
    sshd.rotate_host_key()  # known_hosts keeps the old key
    sock = tmp_path / "user-cm"
    home = home_with(tmp_path, alias(sshd, f"IdentityFile {sshd.client_key}", f'ControlPath "{sock}"',
                                     "StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"))
    opened = subprocess.run(["ssh", "-F", str(home / ".ssh" / "config"), "-o", "BatchMode=yes", "-M", "-fN",
                             "pve-alias"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert opened.returncode == 0, opened.stderr
    try:
        refused = gpuops("status", "-i", str(alias_inventory(tmp_path, sshd)), env=env_of(home, runtime))
        assert refused.code == 3 and "pve1: HOST KEY CHANGED for" in refused.text, refused
    finally:
        subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "pve-alias"], capture_output=True, timeout=30)


def test_a_controlpath_of_the_users_too_long_for_a_socket_leaves_gpuops_its_own_master(
        tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, runtime: Path) -> None:
    """Issue 35 item 11: their ControlMaster auto with a ControlPath ssh cannot bind failed as a wrong address
    (exit 3, "check the address and port"); gpuops' own master, in its short folder, carries the commands."""
    long = tmp_path / ("c" * 100) / "%C"  # ssh expands %C to 40 hex digits
    home = home_with(tmp_path, alias(sshd, f"IdentityFile {sshd.client_key}", "ControlMaster auto",
                                     f'ControlPath "{long}"', f'UserKnownHostsFile "{sshd.known_hosts}"'))
    result = gpuops("status", "-v", "-i", str(alias_inventory(tmp_path, sshd)), env=env_of(home, runtime))
    assert result.code == 0 and "ct200: reachable via pve1, container 200 running" in result.text, result
    assert "gpuops: 1 SSH connection(s)" in result.err
    assert [p for p in (runtime / "gpuops" / "cm").iterdir() if stat.S_ISSOCK(p.stat().st_mode)]


def test_gpuops_own_master_is_made_once_and_reused_by_the_next_command(tmp_path: Path, sshd: SshServer,
                                                                       fake_proxmox: FakeProxmox, runtime: Path) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    env = {"XDG_RUNTIME_DIR": str(runtime), "SSH_AUTH_SOCK": ""}
    first = gpuops("status", "-v", "-i", str(inv), env=env)
    assert first.code == 0, first
    assert "gpuops: 1 SSH connection(s)" in first.err
    assert f"gpuops: SSH connections through OpenSSH ({shutil.which('ssh')})" in first.err
    second = gpuops("status", "-v", "-i", str(inv), env=env)
    assert second.code == 0 and "gpuops: 0 SSH connection(s)" in second.err, second
    assert sshd.connection_count() == 1
    folder = runtime / "gpuops" / "cm"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (socket_path,) = [p for p in folder.iterdir() if stat.S_ISSOCK(p.stat().st_mode)]
    assert len(str(socket_path)) + 17 < 104  # ssh binds NAME.<16 random chars> first
    assert not list(folder.glob("ssh-*.log"))  # ssh's own logs of each command are gone


def test_without_an_ssh_binary_paramiko_connects_and_says_so(tmp_path: Path, sshd: SshServer,
                                                              fake_proxmox: FakeProxmox) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    result = gpuops("status", "-v", "-i", str(inv), env={"PATH": str(tmp_path), "SSH_AUTH_SOCK": ""})
    assert result.code == 0, result
    assert "gpuops: SSH connections through paramiko (no ssh on PATH)" in result.err


# -- how the user logs in -------------------------------------------------------------------------


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Path]:
    """An ssh-agent on a socket of its own (as 1Password, Secretive or gpg-agent provide one)."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, message="ssh-agent's socket")
        yield sock
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_key_held_only_by_an_identity_agent_connects(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox,
                                                       agent: Path) -> None:
    key = tmp_path / "agent_only"
    shutil.copy(sshd.client_key, key)
    added = subprocess.run(["ssh-add", str(key)], env={**os.environ, "SSH_AUTH_SOCK": str(agent)}, capture_output=True,
                           text=True, timeout=30)
    assert added.returncode == 0, added.stderr
    key.unlink()  # only the agent holds it now
    home = home_with(tmp_path, alias(sshd, f"IdentityAgent {agent}", "IdentitiesOnly no"))
    result = gpuops("status", "-i", str(alias_inventory(tmp_path, sshd)), env=env_of(home))
    assert result.code == 0, result
    assert "ct200: reachable via pve1, container 200 running" in result.text


def test_the_users_proxycommand_carries_the_connection(tmp_path: Path, sshd: SshServer,
                                                       fake_proxmox: FakeProxmox) -> None:
    # A ProxyCommand of the user's own (bash's /dev/tcp relay here; nc, cloudflared or a corporate proxy
    # elsewhere) is what ssh runs, so it is what gpuops runs: the relay leaves its mark once per connection.
    mark = tmp_path / "proxied"
    relay = (f"bash -c 'echo %h:%p >>{mark}; exec 3<>/dev/tcp/127.0.0.1/%p; cat <&3 & exec cat >&3'")
    home = home_with(tmp_path, alias(sshd, f"IdentityFile {sshd.client_key}", f"ProxyCommand {relay}"))
    result = gpuops("status", "-i", str(alias_inventory(tmp_path, sshd)), env=env_of(home))
    assert result.code == 0, result
    assert "ct200: reachable via pve1, container 200 running" in result.text
    assert mark.read_text().splitlines() == [f"{sshd.host}:{sshd.port}"]


def test_an_identity_agent_socket_that_is_gone_is_named_at_once(tmp_path: Path, sshd: SshServer) -> None:
    gone = tmp_path / "no-agent.sock"
    home = home_with(tmp_path, alias(sshd, f"IdentityAgent {gone}"))
    result = gpuops("status", "-i", str(alias_inventory(tmp_path, sshd)), env=env_of(home))
    assert result.code == 3, result
    assert f"pve1: authentication failed (Permission denied (publickey)): no agent answers at IdentityAgent {gone}" \
        in result.text, result
    assert sshd.connection_count() == 0


def test_a_certificate_signed_by_a_ca_the_host_trusts_connects(tmp_path: Path) -> None:
    ca, key = tmp_path / "ca", tmp_path / "id_cert"
    for path in (ca, key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    server = SshServer(extra_config=f"TrustedUserCAKeys {ca}.pub")
    fake = FakeProxmox(server.fake_root)
    fake.add_container(200)
    server.authorized_keys.write_text("")  # no key is authorised by itself: only the CA's signature lets one in
    server.start()
    try:
        subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "gpuops-test", "-n", server.user, f"{key}.pub"],
                       check=True, timeout=30)
        home = home_with(tmp_path, alias(server, f"IdentityFile {key}", f"CertificateFile {key}-cert.pub"))
        result = gpuops("status", "-i", str(alias_inventory(tmp_path, server)), env=env_of(home))
        assert result.code == 0, result
        assert server.connection_count() == 1
    finally:
        server.stop()
        fake.cleanup()


# -- failures, each with its cause -----------------------------------------------------------------


def test_a_closed_port_is_said_at_once_without_retrying(tmp_path: Path, sshd: SshServer) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd, ctid=None)
    sshd.stop()
    pool = Pool(load_inventory(str(inv)))  # the default budget (no GPUOPS_CONNECT_RETRY_TIME): 30 s of retries
    host: Any = pool.host("pve1")
    attempts: list[int] = []
    once = host._connect_once
    host._connect_once = lambda: (attempts.append(1), once())[1]
    with pytest.raises(ConnectError) as info:
        host.run(Cmd("true"), timeout=30)
    assert str(info.value) == (f"pve1: cannot connect to {sshd.host}:{sshd.port}: connection refused "
                               "(nothing listens on that port; not retried)")
    assert info.value.exit_code == 3 and attempts == [1]


def test_ssh_own_255_is_a_lost_connection_and_a_command_s_255_is_its_exit_status(tmp_path: Path, sshd: SshServer) -> None:
    nap = "30.0317"  # this test's own remote sleep, told from any other test's `sleep 30` on the machine
    pool = Pool(load_inventory(str(write_inventory(tmp_path / "inv.yaml", sshd, ctid=None))), retry_time=5)
    host = pool.host("pve1")
    try:
        said = host.run(Cmd("bash", "-c", "echo out; echo err >&2; exit 255"), timeout=30)
        assert (said.exit_code, said.out, said.err) == (255, "out\n", "err\n")
        failure: list[BaseException] = []

        def long_command() -> None:
            try:
                host.run(Cmd("sleep", nap), timeout=60)
            except BaseException as exc:  # handed to the test thread
                failure.append(exc)

        worker = threading.Thread(target=long_command, daemon=True)
        worker.start()
        # The remote sleep itself (its whole command line), not the local ssh whose arguments carry the same words:
        # a connection killed before the command reached the host is rightly run again on a new one.
        wait_until(lambda: subprocess.run(["pgrep", "-fx", f"sleep {nap}"], capture_output=True).returncode == 0,
                   message="the remote sleep")
        assert sshd.kill_connections() >= 1
        worker.join(timeout=30)
        assert failure and isinstance(failure[0], ConnectionLost), failure
        assert host.run(Cmd("echo", "back"), timeout=30).out == "back\n"  # a new master
        assert sshd.connection_count() == 2
    finally:
        pool.close()


def test_a_user_known_hosts_file_with_a_space_is_the_file_checked(tmp_path: Path, sshd: SshServer,
                                                                  fake_proxmox: FakeProxmox) -> None:
    folder = tmp_path / "my hosts"
    folder.mkdir()
    known = folder / "kh"
    known.write_text(sshd.known_hosts_line() + "\n")
    home = home_with(tmp_path, alias(sshd, f"IdentityFile {sshd.client_key}", f'UserKnownHostsFile "{known}" /nonexistent/kh'))
    inv = alias_inventory(tmp_path, sshd, known_hosts=None, host_key_policy="accept-new")
    result = gpuops("status", "-i", str(inv), env=env_of(home))
    assert result.code == 0, result
    before = known.read_text()
    sshd.rotate_host_key()
    refused = gpuops("status", "-i", str(inv), env=env_of(home))
    assert refused.code == 3, refused
    assert "pve1: HOST KEY CHANGED for" in refused.text
    assert known.read_text() == before  # accept-new never overwrites a key
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["home", "inv.yaml", "my hosts"])  # no stray file


def test_an_include_with_a_space_in_its_path_is_read_whole(tmp_path: Path, sshd: SshServer,
                                                           fake_proxmox: FakeProxmox) -> None:
    home = home_with(tmp_path, 'Include "my conf/*.conf"\n')
    (home / ".ssh" / "my conf").mkdir()
    (home / ".ssh" / "my conf" / "lab.conf").write_text(alias(sshd, f"IdentityFile {sshd.client_key}"))
    result = gpuops("status", "-i", str(alias_inventory(tmp_path, sshd)), env=env_of(home))
    assert result.code == 0, result
    assert "ct200: reachable via pve1, container 200 running" in result.text
