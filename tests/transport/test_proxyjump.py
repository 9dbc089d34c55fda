"""A ProxyJump list in ~/.ssh/config (`a,b`, also `user@a:port,b`) is followed hop by hop, in order.

Three real sshd: hop a (the `bastion` fixture), hop b (the `hop_b` fixture) and the target. Each hop's
authorized_keys lets the shared client key open a tunnel to the next hop's port only (OpenSSH's
`permitopen`), so a chain in any other order, or one that skips a hop, is refused by sshd itself.
The real OpenSSH client goes through the same config first: both must take the same path.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, SshServer
from bench.cli import gpuops_text


def only_to(hop: SshServer, nxt: SshServer, key: Path) -> None:
    """`key` may log in on `hop` and open tunnels from there to `nxt`'s sshd, nowhere else."""
    hop.authorized_keys.write_text(f'permitopen="{nxt.host}:{nxt.port}" {key.with_suffix(".pub").read_text()}')


def chain_home(tmp_path: Path, target: SshServer, a: SshServer, b: SshServer, proxy_jump: str,
               known: list[SshServer]) -> Path:  # fmt: skip
    """A HOME whose ~/.ssh/config reaches `pve-alias` (the target) through `proxy_jump`."""
    only_to(a, b, target.client_key)
    only_to(b, target, target.client_key)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("".join(s.known_hosts_line() + "\n" for s in known))
    (home / ".ssh" / "config").write_text(
        f"Host pve-alias\n  HostName {target.host}\n  Port {target.port}\n  ProxyJump {proxy_jump}\n"
        f"Host hop-a\n  HostName {a.host}\n  Port {a.port}\n"
        f"Host hop-b\n  HostName {b.host}\n  Port {b.port}\n"
        f"Host *\n  User {target.user}\n  IdentityFile {target.client_key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
    )
    return home


def status(tmp_path: Path, home: Path) -> subprocess.CompletedProcess[str]:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"pve1": {"address": "pve-alias"}},
                                   "targets": {"ct200": {"host": "pve1", "ctid": 200}}}))
    return gpuops_text("status", "-i", str(inv), env={"HOME": str(home), "SSH_AUTH_SOCK": ""})


def openssh(home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", str(home / ".ssh" / "config"), "pve-alias", "echo ok"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("first", ["hop-a", "{user}@{host}:{port}"])
def test_every_hop_of_a_proxyjump_list_is_used_in_order(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer, hop_b: SshServer, first: str
) -> None:
    spec = first.format(user=bastion.user, host=bastion.host, port=bastion.port) + ",hop-b"
    home = chain_home(tmp_path, sshd, bastion, hop_b, spec, [sshd, bastion, hop_b])
    ssh = openssh(home)
    assert ssh.stdout == "ok\n", ssh.stderr  # the real client: a, then b, then the target
    servers = (bastion, hop_b, sshd)
    assert [s.connection_count() for s in servers] == [1, 1, 1]
    result = status(tmp_path, home)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ct200: reachable via pve1, container 200 running" in result.stdout
    assert [s.connection_count() for s in servers] == [2, 2, 2]


def test_the_second_hops_host_key_is_checked_too(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer, hop_b: SshServer
) -> None:
    home = chain_home(tmp_path, sshd, bastion, hop_b, "hop-a,hop-b", [sshd, bastion])  # hop b is unknown
    result = status(tmp_path, home)
    assert result.returncode == 3, result
    unknown = f"unknown host key for [{hop_b.host}]:{hop_b.port} (ssh-ed25519 {hop_b.host_key_fingerprint})"
    assert f"ct200: unreachable: hop-b: {unknown}" in result.stdout
    assert [s.connection_count() for s in (bastion, hop_b, sshd)] == [1, 0, 0]  # reached b only through a
