"""Private keys and ~/.ssh/config that cannot be used are said plainly, at once, before any login is tried.

A missing, unreadable or directory identity_file is a local configuration error (exit 2, never
retried); a key locked with a passphrase that no ssh-agent supplies is an authentication failure
(exit 3) that says so. A missing IdentityFile of ~/.ssh/config is skipped, as OpenSSH skips it, and
a comment there in any encoding is read as OpenSSH reads it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, SshServer, wait_until, write_inventory
from test_known_hosts_files import as_unprivileged, gpuops

PASSPHRASE = "correct horse"


def with_identity(tmp_path: Path, server: SshServer, identity: str) -> Path:
    inv = write_inventory(tmp_path / "inv.yaml", server)
    data = yaml.safe_load(inv.read_text())
    data["hosts"]["pve1"]["identity_file"] = identity
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    return inv


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An empty HOME (no ~/.ssh keys to fall back on) and no agent unless `extra` gives one."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "SSH_AUTH_SOCK": "", **extra}


def locked_key(tmp_path: Path, server: SshServer) -> Path:
    """A key with a passphrase, authorised on `server`."""
    key = tmp_path / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(key)], check=True, timeout=30)
    with server.authorized_keys.open("a") as fh:
        fh.write(key.with_suffix(".pub").read_text())
    return key


@pytest.mark.parametrize("command", ["status", "launch"])
def test_a_missing_identity_file_is_a_configuration_error_said_at_once(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, command: str
) -> None:
    inv = with_identity(tmp_path, sshd, "~/.ssh/id_x")
    env = bare_env(tmp_path)
    pb = tmp_path / "pb.yaml"
    pb.write_text("name: x\ntarget: ct200\nlaunch: {session: x, command: 'true'}\n")
    started = time.monotonic()
    result = gpuops(command, "-i", str(inv), *(["-p", str(pb), "--yes"] if command == "launch" else []), env=env)
    assert time.monotonic() - started < 30  # the 60 s retry budget is not spent
    assert result.returncode == 2, result
    said = result.stdout if command == "status" else result.stderr
    first, hint = said.splitlines()[:2]
    prefix = "ct200: unreachable: " if command == "status" else "gpuops: error: "
    assert first == prefix + "pve1: identity_file ~/.ssh/id_x does not exist"
    assert f"fix hosts.pve1.identity_file in the inventory (here it means {env['HOME']}/.ssh/id_x)" in hint
    assert "retries" not in said and "sshd" not in said and "Traceback" not in result.stderr
    assert sshd.connection_count() == 0


def test_an_identity_file_that_is_a_directory_says_so(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    folder = tmp_path / "keys"
    folder.mkdir()
    result = gpuops("status", "-i", str(with_identity(tmp_path, sshd, str(folder))), env=bare_env(tmp_path))
    assert result.returncode == 2, result
    assert f"pve1: identity_file {folder} is a directory, expected a private key file" in result.stdout


def test_an_unreadable_identity_file_says_permission_denied(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    sshd.client_key.chmod(0)
    inv = with_identity(tmp_path, sshd, str(sshd.client_key))
    result = gpuops("status", "-i", str(inv), env=bare_env(tmp_path), prefix=as_unprivileged())
    assert result.returncode == 2, result
    assert f"pve1: identity_file {sshd.client_key} is not readable (permission denied)" in result.stdout
    assert "that user must be able to read the key" in result.stdout
    assert sshd.connection_count() == 0


def test_a_key_with_a_passphrase_and_no_agent_says_so(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    key = locked_key(tmp_path, sshd)
    started = time.monotonic()
    result = gpuops("status", "-i", str(with_identity(tmp_path, sshd, str(key))), env=bare_env(tmp_path))
    assert time.monotonic() - started < 30
    assert result.returncode == 3, result
    assert result.stdout.splitlines()[:2] == [
        f"ct200: unreachable: pve1: the key {key} needs a passphrase and no ssh-agent is running "
        "(SSH_AUTH_SOCK is not set); gpuops never prompts for one",
        f"ct200: hint: load it into the agent gpuops can reach (`ssh-add {key}`), or use a key without a passphrase",
    ]
    assert sshd.connection_count() == 0


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Path]:
    """A real ssh-agent of this test only, on its own socket."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, message="ssh-agent's socket")
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_same_locked_key_works_once_the_agent_holds_it(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, agent: Path
) -> None:
    key = locked_key(tmp_path, sshd)
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
    askpass.chmod(0o700)
    env = bare_env(tmp_path, SSH_AUTH_SOCK=str(agent))
    subprocess.run(["ssh-add", str(key)], check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
                   env={**os.environ, **env, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force"})
    result = gpuops("status", "-i", str(with_identity(tmp_path, sshd, str(key))), env=env)
    assert result.returncode == 0, result
    assert sshd.connection_count() == 1


def through_alias(tmp_path: Path, sshd: SshServer, env: dict[str, str], config: Path
                  ) -> subprocess.CompletedProcess[str]:
    """Log in as `pve-alias` through `config` with real OpenSSH (it must work), then run `gpuops status` the same way."""
    ssh = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={sshd.known_hosts}",
                          "pve-alias", "echo ok"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ssh.stdout == "ok\n", ssh.stderr
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"pve1": {"address": "pve-alias", "known_hosts": str(sshd.known_hosts)}},
                                   "targets": {"ct200": {"host": "pve1", "ctid": 200}}}))
    return gpuops("status", "-i", str(inv), env=env)


def test_a_missing_identity_file_in_ssh_config_is_skipped_as_openssh_skips_it(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    env = bare_env(tmp_path)
    config = Path(env["HOME"]) / ".ssh" / "config"
    config.write_text(f"Host pve-alias\n  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n"
                      f"  IdentityFile {tmp_path}/gone\n  IdentityFile {sshd.client_key}\n")
    result = through_alias(tmp_path, sshd, env, config)  # OpenSSH logs in with the second key
    assert result.returncode == 0, result
    assert sshd.connection_count() == 2


def test_a_non_utf8_comment_in_ssh_config_is_read_as_openssh_reads_it(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    env = bare_env(tmp_path)
    config = Path(env["HOME"]) / ".ssh" / "config"
    config.write_bytes(b"# the lab in M\xfcnchen\n" + f"Host pve-alias\n  HostName {sshd.host}\n  Port {sshd.port}\n"
                       f"  User {sshd.user}\n  IdentityFile {sshd.client_key}\n".encode())
    result = through_alias(tmp_path, sshd, env, config)
    assert result.returncode == 0, result
    assert "ct200: reachable via pve1, container 200 running" in result.stdout


def test_an_unreadable_ssh_config_says_so(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    env = bare_env(tmp_path)
    config = Path(env["HOME"]) / ".ssh" / "config"
    config.write_text("Host *\n  User nobody\n")
    config.chmod(0)
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    result = gpuops("status", "-i", str(inv), env=env, prefix=as_unprivileged())
    assert result.returncode == 2, result
    assert f"ct200: unreachable: {config}: cannot be read (permission denied)" in result.stdout
