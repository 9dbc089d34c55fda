"""known_hosts files as people really have them: no newline at the end, non-UTF-8 comments, a directory
by mistake, a file gpuops may not read or write.

What gpuops accepts or writes is also handed to the real OpenSSH client: both must agree on the file.
Local file problems are configuration errors (exit 2), said at once and never retried.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from bench import FakeProxmox, SshServer, write_inventory
from bench.cli import REPO, argv

OTHER = "other.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
NO_DAC = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search")  # root, held to file permissions


def gpuops(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
           ) -> subprocess.CompletedProcess[str]:
    """The CLI (under `prefix`, e.g. setpriv) with a 60 s retry budget that a local file error must not spend."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUOPS_") or k.startswith("GPUOPS_FAKE")},
           "GPUOPS_CONNECT_RETRY_TIME": "60", **(env or {})}
    return subprocess.run([*prefix, *argv(*args)], capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
                          stdin=subprocess.DEVNULL)


def as_unprivileged() -> tuple[str, ...]:
    """A prefix that makes permission bits bind: setpriv drops root's bypass; other users need none."""
    return NO_DAC if os.geteuid() == 0 else ()


def openssh(server: SshServer, known: Path) -> subprocess.CompletedProcess[str]:
    """The real ssh client, strict, against `known` as its only known_hosts file."""
    return server.ssh("echo ok", options=["-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes"])


# -- what accept-new writes --------------------------------------------------------------------


def test_accept_new_after_a_last_line_without_newline_starts_a_line_of_its_own(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(OTHER)  # as an editor or `echo -n` can leave it
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known, policy="accept-new")
    first = gpuops("status", "-i", str(inv))
    assert first.returncode == 0, first.stdout + first.stderr
    assert known.read_text() == OTHER + "\n" + sshd.known_hosts_line() + "\n"
    ssh = openssh(sshd, known)
    assert (ssh.returncode, ssh.stdout) == (0, "ok\n"), ssh.stderr
    found = subprocess.run(["ssh-keygen", "-F", "other.example", "-f", str(known)], capture_output=True, text=True)
    assert OTHER in found.stdout  # the line that was there is intact too
    strict = write_inventory(tmp_path / "strict.yaml", sshd, known_hosts=known)
    again = gpuops("status", "-i", str(strict))
    assert again.returncode == 0, again.stdout


def test_a_non_utf8_comment_is_read_as_openssh_reads_it(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "known_hosts"
    line = sshd.known_hosts_line().encode()
    known.write_bytes(b"# server in M\xfcnchen\n" + line + b" pve1 in M\xfcnchen\n")  # Latin-1, not UTF-8
    assert openssh(sshd, known).stdout == "ok\n"
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known)
    result = gpuops("status", "-i", str(inv))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ct200: reachable via pve1, container 200 running" in result.stdout


def test_accept_new_after_a_non_utf8_comment_keeps_its_bytes(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "known_hosts"
    known.write_bytes(b"# M\xfcnchen")  # not UTF-8, and no newline at the end either
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known, policy="accept-new")
    result = gpuops("status", "-i", str(inv))
    assert result.returncode == 0, result.stdout + result.stderr
    assert known.read_bytes() == b"# M\xfcnchen\n" + sshd.known_hosts_line().encode() + b"\n"
    assert openssh(sshd, known).stdout == "ok\n"


# -- a known_hosts gpuops cannot use: exit 2 at once ---------------------------------------------


def test_a_known_hosts_directory_is_a_configuration_error_said_at_once(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "known_hosts"
    known.mkdir()
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known)
    started = time.monotonic()
    status = gpuops("status", "-i", str(inv))
    assert time.monotonic() - started < 30  # the 60 s retry budget is not spent
    assert status.returncode == 2, status
    assert status.stdout.splitlines()[0] == f"ct200: unreachable: pve1: known_hosts {known} is a directory, expected a file"
    assert "ct200: hint: set known_hosts" in status.stdout
    assert "retries" not in status.stdout and "sshd" not in status.stdout
    pb = tmp_path / "pb.yaml"
    pb.write_text("name: x\ntarget: ct200\nlaunch: {session: x, command: 'true'}\n")
    launch = gpuops("launch", "--yes", "-i", str(inv), "-p", str(pb))
    assert launch.returncode == 2, launch
    assert launch.stderr.startswith(f"gpuops: error: pve1: known_hosts {known} is a directory, expected a file\nhint: ")
    assert "Traceback" not in launch.stderr
    assert sshd.connection_count() == 0


def test_an_unreadable_known_hosts_says_so(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n")
    known.chmod(0)
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known)
    result = gpuops("status", "-i", str(inv), prefix=as_unprivileged())
    assert result.returncode == 2, result
    assert f"ct200: unreachable: pve1: known_hosts {known} is not readable (permission denied)" in result.stdout
    assert sshd.connection_count() == 0


def test_accept_new_into_a_read_only_known_hosts_says_it_cannot_record_the_key(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(OTHER + "\n")
    known.chmod(0o444)
    inv = write_inventory(tmp_path / "inv.yaml", sshd, known_hosts=known, policy="accept-new")
    result = gpuops("status", "-i", str(inv), prefix=as_unprivileged())
    assert result.returncode == 2, result
    assert (f"ct200: unreachable: pve1: cannot record the new host key of [{sshd.host}]:{sshd.port} "
            f"in known_hosts {known} (permission denied)") in result.stdout
    assert known.read_text() == OTHER + "\n"
    assert sshd.connection_count() == 0
