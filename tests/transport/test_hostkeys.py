"""Host keys against real sshd servers: unknown and changed keys are refused before anything runs.

Every hop is checked the same way: the target host and its jump host (a second real sshd used
as a bastion). "Nothing ran" is checked from the server side: no login in sshd's log, no
~/.gpuops run directory, no tmux session, known_hosts untouched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench import FakeProxmox, SshServer, jsoncheck, write_inventory
from bench.inventory import host_entry

REPO = Path(__file__).resolve().parents[2]
GPUOPS_VARS = ("GPUOPS_INVENTORY", "GPUOPS_PLAYBOOK", "GPUOPS_TARGET", "GPUOPS_CONNECT_RETRY_TIME")
PLAYBOOK = (
    "name: keys\ntarget: ct200\npreflight: {gpus: [0]}\n"
    "launch: {session: keys-train, command: fake-train --mode steps --gpus 0 --steps 100000 --interval 0.2}\n"
    "watch: {stall_timeout: 0}\nabort: {grace: 2}\n"
)


def gpuops(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in GPUOPS_VARS}
    env["GPUOPS_CONNECT_RETRY_TIME"] = "5"  # a host-key error must not wait for it anyway
    result = subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    jsoncheck.check(args, result.stdout)  # every --json line valid against `gpuops schema`
    return result


@pytest.fixture
def playbook(tmp_path: Path) -> Path:
    path = tmp_path / "keys.yaml"
    path.write_text(PLAYBOOK)
    return path


def key_name(server: SshServer) -> str:
    return f"[{server.host}]:{server.port}"


def assert_nothing_ran(fake: FakeProxmox, *servers: SshServer) -> None:
    """No login on any server, no gpuops state and no tmux session on the host or in the container."""
    for server in servers:
        assert server.connection_count() == 0, f"{server} accepted a login"
    for vmid in (None, 200):
        assert not (fake.home(vmid) / ".gpuops").exists()
        assert fake.tmux(vmid, "ls").returncode != 0  # no tmux server, so no session


def jump_inventory(tmp_path: Path, target: SshServer, jump: SshServer, known: Path, *, policy: str = "strict",
                   jump_policy: str = "strict") -> Path:  # fmt: skip
    return write_inventory(
        tmp_path / "inv.yaml", target, known_hosts=known, policy=policy, jump="bastion",
        extra_hosts={"bastion": host_entry(jump, policy=jump_policy, known_hosts=known)},
    )  # fmt: skip


# -- unknown key -------------------------------------------------------------------------------


def test_unknown_key_under_strict_is_refused_with_fingerprint_and_keyscan_hint(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known)
    result = gpuops("status", "-i", str(inv))
    assert result.returncode == 3, result
    out = result.stdout
    unknown = f"unknown host key for {key_name(sshd)} (ssh-ed25519 {sshd.host_key_fingerprint})"
    assert f"ct200: unreachable: pve1: {unknown}" in out
    assert f"`ssh-keyscan -p {sshd.port} {sshd.host} >> {known}`" in out
    assert "Traceback" not in result.stderr
    assert known.read_text() == ""
    assert_nothing_ran(fake_proxmox, sshd)


def test_unknown_key_stops_launch_before_anything_runs(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, playbook: Path
) -> None:
    known = tmp_path / "known_hosts"
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known)
    result = gpuops("launch", "--yes", "-i", str(inv), "-p", str(playbook))
    assert result.returncode == 3, result
    assert f"gpuops: error: pve1: unknown host key for {key_name(sshd)}" in result.stderr
    assert sshd.host_key_fingerprint in result.stderr
    assert f"hint: verify the fingerprint out of band, then trust it with `ssh-keyscan -p {sshd.port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not known.exists()
    assert_nothing_ran(fake_proxmox, sshd)


def test_the_keyscan_hint_works_as_printed(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "known_hosts"
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known)
    refused = gpuops("status", "-i", str(inv))
    command = re.search(r"trust it with `([^`]+)`", refused.stdout)
    assert command, refused.stdout
    subprocess.run(["bash", "-c", command[1]], check=True, capture_output=True, timeout=60)
    trusted = gpuops("status", "-i", str(inv))
    assert trusted.returncode == 0, trusted.stdout
    assert "ct200: reachable via pve1, container 200 running" in trusted.stdout


def test_unknown_key_in_json_carries_error_and_hint(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=tmp_path / "known_hosts")
    result = gpuops("status", "--json", "-i", str(inv))
    assert result.returncode == 3
    (line,) = result.stdout.splitlines()
    obj = json.loads(line)
    assert obj["reachable"] is False and obj["target"] == "ct200"
    assert sshd.host_key_fingerprint in obj["error"]
    assert "ssh-keyscan" in obj["hint"]


# -- accept-new --------------------------------------------------------------------------------


def test_accept_new_records_the_key_and_the_next_run_uses_it(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "fresh" / "dir" / "known_hosts"  # its folder does not exist yet
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known, policy="accept-new")
    first = gpuops("status", "-i", str(inv))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "ct200: reachable via pve1, container 200 running" in first.stdout
    assert known.read_text() == sshd.known_hosts_line() + "\n"
    second = gpuops("status", "-i", str(inv))
    assert second.returncode == 0
    assert known.read_text() == sshd.known_hosts_line() + "\n"  # used, not appended again
    # The recorded key is a real known_hosts line: strict mode and OpenSSH itself accept it now.
    strict = write_inventory(tmp_path / "strict.yaml", sshd, known_hosts=known)
    assert gpuops("status", "-i", str(strict)).returncode == 0
    ssh = sshd.ssh("echo ok", options=["-o", f"UserKnownHostsFile={known}"])
    assert ssh.stdout == "ok\n", ssh.stderr


def test_accept_new_keeps_the_other_lines_of_known_hosts(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "known_hosts"
    others = (
        "# my hosts\n"
        "other.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    known.write_text(others)
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known, policy="accept-new")
    assert gpuops("status", "-i", str(inv)).returncode == 0
    assert known.read_text() == others + sshd.known_hosts_line() + "\n"


# -- changed key -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_changed_key_is_refused_with_both_fingerprints(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, playbook: Path, policy: str
) -> None:
    old = sshd.host_key_fingerprint
    known_before = sshd.known_hosts.read_text()
    sshd.rotate_host_key()
    new = sshd.host_key_fingerprint
    assert old != new
    inv = write_inventory(tmp_path / "inv.yaml", sshd, policy=policy)
    status = gpuops("status", "-i", str(inv))
    assert status.returncode == 3, status
    assert f"ct200: unreachable: pve1: HOST KEY CHANGED for {key_name(sshd)}" in status.stdout
    assert f"known_hosts has ssh-ed25519 {old}, the host presented ssh-ed25519 {new}" in status.stdout
    launch = gpuops("launch", "--yes", "-i", str(inv), "-p", str(playbook))
    assert launch.returncode == 3, launch
    assert old in launch.stderr and new in launch.stderr
    assert "Traceback" not in status.stderr + launch.stderr
    assert sshd.known_hosts.read_text() == known_before  # accept-new never overwrites a key
    assert_nothing_ran(fake_proxmox, sshd)


def test_the_ssh_keygen_hint_for_a_changed_key_removes_the_right_entry(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    sshd.rotate_host_key()
    inv = write_inventory(tmp_path / "inv.yaml", sshd, policy="accept-new")
    refused = gpuops("status", "-i", str(inv))
    command = re.search(r"remove the old key with `([^`]+)`", refused.stdout)
    assert command, refused.stdout
    assert f"'{key_name(sshd)}'" in command[1]
    subprocess.run(["bash", "-c", command[1]], check=True, capture_output=True, timeout=60)
    again = gpuops("status", "-i", str(inv))
    assert again.returncode == 0, again.stdout
    assert sshd.known_hosts_line() in sshd.known_hosts.read_text()


# -- jump host ---------------------------------------------------------------------------------


def test_through_a_known_jump_host(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n" + bastion.known_hosts_line() + "\n")
    result = gpuops("status", "-i", str(jump_inventory(tmp_path, sshd, bastion, known)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ct200: reachable via pve1, container 200 running" in result.stdout
    assert bastion.connection_count() == 1 and sshd.connection_count() == 1


def test_unknown_jump_key_is_refused(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n")  # the target is known, its bastion is not
    result = gpuops("status", "-i", str(jump_inventory(tmp_path, sshd, bastion, known, policy="accept-new")))
    assert result.returncode == 3, result
    unknown = f"unknown host key for {key_name(bastion)} (ssh-ed25519 {bastion.host_key_fingerprint})"
    assert f"ct200: unreachable: bastion: {unknown}" in result.stdout
    assert f"ssh-keyscan -p {bastion.port} {bastion.host} >> {known}" in result.stdout
    assert known.read_text() == sshd.known_hosts_line() + "\n"
    assert_nothing_ran(fake_proxmox, sshd, bastion)


def test_accept_new_on_the_jump_host_records_its_key(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n")
    result = gpuops("status", "-i", str(jump_inventory(tmp_path, sshd, bastion, known, jump_policy="accept-new")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert known.read_text() == sshd.known_hosts_line() + "\n" + bastion.known_hosts_line() + "\n"


def test_unknown_target_key_behind_a_known_jump_is_refused(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(bastion.known_hosts_line() + "\n")
    result = gpuops("status", "-i", str(jump_inventory(tmp_path, sshd, bastion, known)))
    assert result.returncode == 3, result
    assert f"pve1: unknown host key for {key_name(sshd)} (ssh-ed25519 {sshd.host_key_fingerprint})" in result.stdout
    assert_nothing_ran(fake_proxmox, sshd)


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
def test_changed_jump_key_is_refused_with_both_fingerprints(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer, playbook: Path, policy: str
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n" + bastion.known_hosts_line() + "\n")
    known_before = known.read_text()
    old = bastion.host_key_fingerprint
    bastion.rotate_host_key()
    inv = jump_inventory(tmp_path, sshd, bastion, known, policy=policy, jump_policy=policy)
    status = gpuops("status", "-i", str(inv))
    assert status.returncode == 3, status
    assert f"bastion: HOST KEY CHANGED for {key_name(bastion)}" in status.stdout
    new = bastion.host_key_fingerprint
    assert f"known_hosts has ssh-ed25519 {old}, the host presented ssh-ed25519 {new}" in status.stdout
    launch = gpuops("launch", "--yes", "-i", str(inv), "-p", str(playbook))
    assert launch.returncode == 3, launch
    assert "bastion: HOST KEY CHANGED" in launch.stderr
    assert known.read_text() == known_before
    assert_nothing_ran(fake_proxmox, sshd, bastion)


# -- a large known_hosts file ------------------------------------------------------------------

KEY_TYPES = ("ed25519", "ecdsa", "rsa")


@pytest.fixture(scope="module")
def public_keys(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    """Six real public keys, two of each type: (type name, base64)."""
    folder = tmp_path_factory.mktemp("keys")
    keys = []
    for i, kind in enumerate(KEY_TYPES * 2):
        path = folder / f"k{i}"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True, timeout=60)
        name, blob = path.with_suffix(".pub").read_text().split()[:2]
        keys.append((name, blob))
    return keys


UNREADABLE = ("broken.example {t} not-base64!!", "short.example ssh-ed25519", "|1|AAAA|BBBB {t} {k}",
              "|1|not-base64|x {t} {k}", "|1| {t} {k}")


def a_crowded_known_hosts(path: Path, keys: list[tuple[str, str]]) -> list[str]:
    """Every shape paramiko reads: plain, [host]:port, several names a line, hashed (ssh-keygen -H),
    conflicting duplicates (first wins), markers, comments, tabs, bad lines. Returns the names."""
    (t0, k0), (t1, k1), (t2, k2), (t3, k3), (t4, k4), (t5, k5) = keys
    lines = ["# a comment", "", f"plain.example {t0} {k0}", f"plain.example {t0} {k3}",  # conflict: first wins
             f"[ported.example]:2222 {t1} {k1}", f"ported.example {t2} {k2}",
             f"a.example,b.example,10.0.0.7 {t4} {k4}", f"tabbed.example\t{t5}\t{k5}",
             f"@cert-authority *.example {t0} {k0}", f"@revoked plain.example {t3} {k3}",
             f"hashed.example {t1} {k1}", f"[hashed.example]:2222 {t2} {k2}",
             f"mixed.example {t3} {k3}", f"mixed.example {t0} {k0}", f"mixed.example {t3} {k4}"]
    lines += [f"filler{i}.example,10.9.{i // 200}.{i % 200} {t} {k}" for i, (t, k) in enumerate(keys * 60)]
    path.write_text("\n".join(lines) + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], check=True, capture_output=True, timeout=60)
    text = path.read_text()
    assert "hashed.example" not in text and "|1|" in text  # ssh-keygen -H hashed every name
    # Lines ssh-keygen refuses (it rejects the whole file) and paramiko dies on: bad base64, and
    # malformed hashes (its lookup asserts the salt's length).
    path.write_text(text + "".join(f"{line}\n" for line in UNREADABLE).format(t=t0, k=k0))
    return ["plain.example", "[ported.example]:2222", "ported.example", "a.example", "b.example", "10.0.0.7",
            "tabbed.example", "hashed.example", "[hashed.example]:2222", "mixed.example", "broken.example",
            "short.example", "*.example", "filler7.example", "[filler7.example]:22", "10.9.0.7", "nowhere.example"]


def test_loading_only_the_servers_lines_gives_paramikos_own_verdicts(
    tmp_path: Path, public_keys: list[tuple[str, str]]
) -> None:
    from gpuops.transport.ssh._paramiko import paramiko
    from gpuops.transport.ssh.paramiko_ssh.hostkeys import load_known_hosts

    known = tmp_path / "known_hosts"
    names = a_crowded_known_hosts(known, public_keys)
    # paramiko's load() dies on marker lines and bad base64 (InvalidHostKey, before this change an
    # internal error of every gpuops command): it reads the file without them, ours reads it all.
    readable = tmp_path / "readable"
    unreadable = tuple(line.split(" ")[0] + " " for line in UNREADABLE)
    readable.write_text("".join(line for line in known.read_text().splitlines(keepends=True)
                                if not line.startswith(("@", *unreadable))))
    with pytest.raises(paramiko.hostkeys.InvalidHostKey):
        paramiko.HostKeys().load(str(known))
    with pytest.raises(AssertionError):  # and its lookup, on a malformed hash
        paramiko.HostKeys.hash_host("x", "|1|AAAA|BBBB")
    whole = paramiko.HostKeys()
    whole.load(str(readable))
    for name in names:
        host, port = (name[1:].split("]:")[0], int(name.split("]:")[1])) if name.startswith("[") else (name, 22)
        client = paramiko.SSHClient()
        load_known_hosts(client, str(known), host, port)
        ours, theirs = client.get_host_keys().lookup(name), whole.lookup(name)
        as_text = lambda found: {t: found[t].get_base64() for t in found} if found else None  # noqa: E731
        assert as_text(ours) == as_text(theirs), name
    assert whole.lookup("plain.example")[public_keys[0][0]].get_base64() == public_keys[0][1]  # the first line won


def test_a_crowded_hashed_known_hosts_still_lets_in_the_right_key_and_refuses_a_changed_one(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, public_keys: list[tuple[str, str]]
) -> None:
    known = tmp_path / "known_hosts"
    a_crowded_known_hosts(known, public_keys)
    hashed = tmp_path / "this_server"
    hashed.write_text(sshd.known_hosts_line() + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], check=True, capture_output=True, timeout=60)
    known.write_text(known.read_text() + hashed.read_text())  # the server's line last, hashed
    assert key_name(sshd) not in known.read_text()
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known)
    ok = gpuops("status", "-i", str(inv))
    assert ok.returncode == 0, ok
    sshd.rotate_host_key()
    for policy in ("strict", "accept-new"):
        before = known.read_text()
        inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known, policy=policy)
        refused = gpuops("status", "-i", str(inv))
        assert refused.returncode == 3, refused
        assert f"HOST KEY CHANGED for {key_name(sshd)}" in refused.stdout
        assert known.read_text() == before


# -- @revoked ------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, revoked", [
    ("*", True), ("*.example", True), ("pve?.example", True), ("PVE1.Example", True),
    ("other.example", False), ("*.example,!pve1.example", False), ("!pve1.example,*", False),
    ("pve1", False), ("*.examplex", False),
])
def test_revoked_lines_follow_openssh_host_patterns(
    tmp_path: Path, public_keys: list[tuple[str, str]], pattern: str, revoked: bool
) -> None:
    from gpuops.transport.ssh._paramiko import paramiko
    from gpuops.transport.ssh.paramiko_ssh.hostkeys import load_known_hosts

    (t0, k0), (t1, k1) = public_keys[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"pve1.example {t0} {k0}\npve1.example {t1} {k1}\n@revoked {pattern} {t0} {k0}\n")
    client = paramiko.SSHClient()
    found = load_known_hosts(client, str(known), "pve1.example", 22)
    assert (k0 in found) is revoked
    kept = client.get_host_keys().lookup("pve1.example")
    assert (t0 in kept) is not revoked and kept[t1].get_base64() == k1  # only the revoked key is dropped


@pytest.mark.parametrize("policy", ["strict", "accept-new"])
@pytest.mark.parametrize("also_trusted", [True, False])
def test_a_revoked_key_is_refused_whatever_else_known_hosts_says(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, policy: str, also_trusted: bool
) -> None:
    line = sshd.known_hosts_line()
    key = " ".join(line.split()[1:])
    known = tmp_path / "known_hosts"
    known.write_text((line + "\n" if also_trusted else "") + f"@revoked * {key}\n")
    before = known.read_text()
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known, policy=policy)
    refused = gpuops("status", "-i", str(inv))
    assert refused.returncode == 3, refused
    assert f"ct200: unreachable: pve1: HOST KEY REVOKED for {key_name(sshd)}" in refused.stdout
    assert sshd.host_key_fingerprint in refused.stdout
    assert known.read_text() == before  # accept-new does not record it either
    assert_nothing_ran(fake_proxmox, sshd)


def test_a_revoked_key_among_changed_ones_says_revoked(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    # known_hosts trusts the server's old key; the server now presents a key that is revoked.
    old = sshd.known_hosts_line()
    sshd.rotate_host_key()
    new_key = " ".join(sshd.known_hosts_line().split()[1:])
    known = tmp_path / "known_hosts"
    known.write_text(f"{old}\n@revoked {key_name(sshd)} {new_key}\n")
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known)
    refused = gpuops("status", "-i", str(inv))
    assert refused.returncode == 3, refused
    assert "HOST KEY REVOKED" in refused.stdout and "HOST KEY CHANGED" not in refused.stdout
    assert_nothing_ran(fake_proxmox, sshd)
