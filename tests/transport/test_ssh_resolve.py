"""~/.ssh/config as OpenSSH reads it (`ssh -G`): an Include'd alias, Match, a ProxyCommand, ssh args.

Real sshd on 127.0.0.1 (the bench), real `gpuops status`; `ssh -G` itself is checked never to connect.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, SshServer
from bench.cli import gpuops_text

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")


def home_with(tmp_path: Path, config: str, **files: str) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "config").write_text(config)
    for name, text in files.items():
        path = home / ".ssh" / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return home


def alias_inventory(tmp_path: Path, sshd: SshServer, **host: object) -> Path:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"pve1": {"address": "pve-alias", "known_hosts": str(sshd.known_hosts),
                                                      **host}},
                                   "targets": {"ct200": {"host": "pve1", "ctid": 200}}}))
    return inv


def status(inv: Path, home: Path, *more: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "SSH_AUTH_SOCK": "", "GPUOPS_CONNECT_RETRY_TIME": "0"}
    if path is not None:
        env["PATH"] = path
    return gpuops_text("status", "-i", str(inv), *more, env=env)


def alias_block(sshd: SshServer) -> str:
    return (f"Host pve-alias\n  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n"
            f"  IdentityFile {sshd.client_key}\n")


@pytest.mark.parametrize("include", ["absolute", "relative"])
def test_an_alias_that_lives_in_an_included_file_is_reached(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, include: str
) -> None:
    conf_d = tmp_path / "home" / ".ssh" / "conf.d"
    # A relative Include is relative to ~/.ssh: $HOME's, here (ssh's would be the passwd home's).
    where = f"{conf_d}/*.conf" if include == "absolute" else "conf.d/*.conf"
    home = home_with(tmp_path, f"Include {where}\n", **{"conf.d__lab.conf": alias_block(sshd)})
    inv = alias_inventory(tmp_path, sshd)
    result = status(inv, home, "-v")
    assert result.returncode == 0, result
    assert result.stdout.startswith("ct200: reachable via pve1, container 200 running\n")
    assert "ssh configuration resolved by OpenSSH (ssh -G)" in result.stderr
    assert sshd.connection_count() == 1
    # paramiko's own parser (no ssh on PATH) has no Include: the alias is then looked up as a host name.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python3")
    without = status(inv, home, "-v", path=str(bin_dir))
    assert without.returncode == 3, without
    assert "cannot connect to pve-alias" in without.stdout
    assert "resolved by paramiko (no ssh on PATH)" in without.stderr


def test_match_and_first_value_wins_as_openssh(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    # `Match originalhost` (paramiko reads no originalhost) and an earlier `Host *` Port that must win.
    home = home_with(tmp_path, f"Match originalhost pve-alias\n  HostName {sshd.host}\n  Port {sshd.port}\n"
                               f"  User {sshd.user}\n  IdentityFile {sshd.client_key}\nHost *\n  Port 1\n")
    result = status(alias_inventory(tmp_path, sshd), home)
    assert result.returncode == 0, result
    assert sshd.connection_count() == 1


def test_a_proxycommand_in_ssh_config_is_gone_through(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n" + bastion.known_hosts_line() + "\n")
    inner = (f"ssh -F none -i {bastion.client_key} -o UserKnownHostsFile={known} -o BatchMode=yes "
             f"-p {bastion.port} -l {bastion.user} -W %h:%p {bastion.host}")
    # Wrapped in sh: a ProxyCommand gpuops runs as a command, as ssh does (not read as a jump host).
    home = home_with(tmp_path, alias_block(sshd).replace("Host pve-alias\n", "Host pve-alias\n  ProxyCommand sh -c "
                                                          f"'exec {inner}'\n"))
    inv = alias_inventory(tmp_path, sshd, known_hosts=str(known))
    result = status(inv, home)
    assert result.returncode == 0, result
    assert bastion.connection_count() == 1 and sshd.connection_count() == 1


def test_ssh_minus_g_never_connects(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    home = home_with(tmp_path, f"Host pve-alias\n  HostName 127.0.0.1\n  Port {port}\n"
                               f"  ProxyCommand touch {tmp_path}/ran\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"pve1": {"address": "pve-alias"}},
                                   "targets": {"ct200": {"host": "pve1", "ctid": 200}}}))
    result = gpuops_text("validate", "-i", str(inv), "--json", env={"HOME": str(home)})
    assert result.returncode == 0, result
    (view,) = json.loads(result.stdout.splitlines()[-1])["targets"]
    assert (view["address"], view["port"], view["proxy_command"]) == ("127.0.0.1", port, f"touch {tmp_path}/ran")
    with pytest.raises(socket.timeout):
        listener.accept()
    assert not (tmp_path / "ran").exists()
    listener.close()
