"""Transports against a real OpenSSH server on 127.0.0.1: exact results, one connection, pct, failures.

The SSH side is the bench's real sshd; only `pct` and `nvidia-smi` are stand-ins. CLI tests run
`python -m gpuops` as a user does; API tests use Pool/SshTransport/PctTransport where that is clearer.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench import FakeProxmox, SshServer, wait_until, write_inventory
from bench.cli import gpuops_text
from bench.inventory import host_entry
from bench.procs import is_alive

from gpuops.command import Cmd, Script, bash
from gpuops.config import load_inventory
from gpuops.errors import AuthError, CommandTimeout, ConnectError, ContainerNotRunning
from gpuops.transport import Pool
from gpuops.transport.local import LocalTransport
from gpuops.transport.pct import PctTransport
from gpuops.transport.ssh.paramiko_ssh.lowlatency import LowLatencySocket
from gpuops.transport.ssh.paramiko_ssh.paramiko_transport import SshTransport

REPO = Path(__file__).resolve().parents[2]


def gpuops(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would; the developer's own GPUOPS_* variables never leak in."""
    return gpuops_text(*args, env=env, timeout=timeout)


def pool_for(path: Path, *, retry_time: float = 5.0) -> Pool:
    return Pool(load_inventory(str(path)), retry_time=retry_time)


def edit_inventory(path: Path, host: str = "pve1", **changes: Any) -> Path:
    data = yaml.safe_load(path.read_text())
    data["hosts"][host].update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def dead_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(tmp_path: Path) -> dict[str, str]:
    """An empty HOME (no ~/.ssh keys or config) and no ssh-agent: only what the inventory names is used."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "SSH_AUTH_SOCK": ""}


@pytest.fixture
def no_agent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process without ssh-agent and with an empty HOME (no ~/.ssh keys tried behind our back)."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


# -- exact results -----------------------------------------------------------------------------


def test_ssh_run_returns_exact_stdout_stderr_and_exit_code(tmp_path: Path, sshd: SshServer) -> None:
    pool = pool_for(write_inventory(tmp_path / "inv.yaml", sshd, ctid=None))
    host = pool.host("pve1")
    try:
        script = Script(r"printf 'line 1\nno newline\0\377'", "printf 'warn: x\\n' >&2", "exit 7")
        result = host.run(bash(script), timeout=30)
        assert result.exit_code == 7
        assert result.stdout == b"line 1\nno newline\0\xff"
        assert result.stderr == b"warn: x\n"
        hostile = ["a b", "it's", '"dq"', "$HOME", "`id`", "*", "", "line\nbreak", "-n"]
        echoed = host.run(Cmd("printf", "%s|", *hostile), timeout=30)
        assert echoed.exit_code == 0 and echoed.out == "".join(f"{w}|" for w in hostile)
        big = host.run(bash(Script("head -c 3000000 /dev/zero | tr '\\0' x")), timeout=60)
        assert big.stdout == b"x" * 3_000_000
        fed = host.run(Cmd("sha256sum"), stdin=b"y" * 1_000_000, timeout=30)
        assert fed.out.split()[0] == hashlib.sha256(b"y" * 1_000_000).hexdigest()
        assert host.run(Cmd("false"), timeout=30).exit_code == 1
        killed = host.run(bash(Script("kill -KILL $$")), timeout=30)
        assert killed.exit_code != 0
    finally:
        pool.close()


def test_one_connection_serves_every_command_of_an_invocation(tmp_path: Path, sshd: SshServer) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd, ctid=None)
    pool = pool_for(inv)
    try:
        for i in range(5):
            assert pool.host("pve1").run(Cmd("echo", str(i)), timeout=30).out == f"{i}\n"
        assert pool.connections_made() == 1
        assert sshd.connection_count() == 1
    finally:
        pool.close()


def test_connections_send_and_acknowledge_at_once(tmp_path: Path, sshd: SshServer, bastion: SshServer) -> None:
    # paramiko's connections (no `ssh` binary): Nagle plus delayed ACKs cost ~40 ms per request/response on the SSH handshake and on each
    # channel open (benchmarks/run.py status shows it); the socket under every connection opts out,
    # a jump host's too (the target's connection runs inside the jump's channel, over that socket).
    direct = write_inventory(tmp_path / "direct.yaml", sshd, ctid=None)
    jumped = write_inventory(tmp_path / "jumped.yaml", sshd, ctid=None, jump="bastion",
                             extra_hosts={"bastion": host_entry(bastion)})
    for inv, hops in ((direct, 1), (jumped, 2)):
        hosts = load_inventory(str(inv)).hosts
        pool = SshTransport(hosts["pve1"], hosts, retry_time=5)  # paramiko: where there is no `ssh` binary
        try:
            for i in range(3):
                assert pool.run(Cmd("echo", str(i)), timeout=30).out == f"{i}\n"
            clients = pool._conn.clients
            assert len(clients) == hops
            sock = clients[0].get_transport().sock
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            # The kernel drops QUICKACK on its own (reading it back says so), so it is re-armed on every read.
            assert isinstance(sock, LowLatencySocket)
        finally:
            pool.close()


def test_status_over_two_targets_on_one_host_makes_one_connection(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    fake_proxmox.add_container(201)
    inv = write_inventory(tmp_path / "inv.yaml", sshd, extra_targets={"ct201": {"host": "pve1", "ctid": 201}})
    result = gpuops("status", "-i", str(inv))
    assert result.returncode == 0, result.stderr
    assert "ct200: reachable via pve1, container 200 running" in result.stdout
    assert "ct201: reachable via pve1, container 201 running" in result.stdout
    assert sshd.connection_count() == 1


def test_launch_detach_status_logs_stop_share_one_login_through_gpuops_own_master(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    pb = tmp_path / "train.yaml"
    pb.write_text(
        "name: conn\ntarget: ct200\npreflight: {gpus: [2]}\n"
        "launch: {session: conn-train, command: fake-train --mode steps --gpus 2 --steps 100000 --interval 0.2}\n"
        "watch: {stall_timeout: 0}\nabort: {grace: 2}\n"
    )
    for command in (["launch", "--detach", "--yes"], ["status", "-v"], ["logs"], ["stop"]):
        result = gpuops(*command, "-i", str(inv), "-p", str(pb))
        assert result.returncode == 0, (command, result.stderr)
        assert sshd.connection_count() == 1, command  # the first command's ControlMaster serves the later ones
    assert "gpuops: 0 SSH connection(s)" in gpuops("status", "-v", "-i", str(inv)).stderr


# -- pct: inside the container ----------------------------------------------------------------

PROBE_ENV = Script("env")


def _env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_pct_over_ssh_runs_inside_the_container(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    pool = pool_for(write_inventory(tmp_path / "inv.yaml", sshd))
    try:
        inv = pool.inventory
        ct = pool.target(inv.targets["ct200"])
        assert isinstance(ct, PctTransport)
        inside = ct.run(bash(PROBE_ENV), timeout=30)
        host = pool.host("pve1").run(bash(PROBE_ENV), timeout=30)
        env_in, env_host = _env_of(inside.out), _env_of(host.out)
        assert env_in["HOME"] == str(fake_proxmox.home(200))
        assert env_host["HOME"] == str(fake_proxmox.home(None))
        assert env_in["GPUOPS_FAKE_CT"] == "200"
        # The SSH session's environment stays on the host (PVE 9 runs pct exec with a clean env).
        assert "SSH_CONNECTION" in env_host and "SSH_CONNECTION" not in env_in
        assert env_in["TMUX_TMPDIR"] == str(fake_proxmox.tmux_tmpdir(200))
        # What the command writes to ~ lands in the container's home, not the host's.
        ct.run(bash(Script('echo inside > "$HOME/marker"')), timeout=30)
        assert (fake_proxmox.home(200) / "marker").read_text() == "inside\n"
        assert not (fake_proxmox.home(None) / "marker").exists()
        # exact stdout/stderr/exit code through both shell layers, with hostile words
        words = ["a b", "it's", "$HOME", "`id`", ""]
        result = ct.run(bash(Script(Cmd("printf", "%s|", *words), "echo oops >&2", "exit 5")), timeout=30)
        assert (result.exit_code, result.out, result.err) == (5, "".join(f"{w}|" for w in words), "oops\n")
        assert pool.connections_made() == 1 and sshd.connection_count() == 1
    finally:
        pool.close()


def test_pct_over_ssh_stopped_and_missing_containers_raise(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    fake_proxmox.add_container(201, running=False)
    more = {"ct201": {"host": "pve1", "ctid": 201}, "ct202": {"host": "pve1", "ctid": 202}}
    inv = write_inventory(tmp_path / "inv.yaml", sshd, extra_targets=more)
    pool = pool_for(inv)
    try:
        targets = pool.inventory.targets
        with pytest.raises(ContainerNotRunning, match="container 201 is not running"):
            pool.target(targets["ct201"]).run(Cmd("true"), timeout=30)
        with pytest.raises(ContainerNotRunning, match="container 202 does not exist"):
            pool.target(targets["ct202"]).run(Cmd("true"), timeout=30)
        assert pool.target(targets["ct200"]).run(Cmd("true"), timeout=30).exit_code == 0
    finally:
        pool.close()


def test_pct_over_local_runs_inside_the_container(local_proxmox: FakeProxmox) -> None:
    ct = PctTransport(LocalTransport("here"), 200)
    result = ct.run(bash(PROBE_ENV), timeout=30)
    env_in = _env_of(result.out)
    assert env_in["HOME"] == str(local_proxmox.home(200))
    assert env_in["GPUOPS_FAKE_CT"] == "200"
    assert env_in["GPUOPS_FAKE_GPUS"] == str(local_proxmox.gpu_dir(200))
    assert "PYTEST_CURRENT_TEST" in os.environ and "PYTEST_CURRENT_TEST" not in env_in  # gpuops' env stays out
    words = ["a b", "it's", "$HOME", ""]
    echoed = ct.run(Cmd("printf", "%s|", *words), timeout=30)
    assert echoed.out == "".join(f"{w}|" for w in words)
    assert ct.run(Cmd("cat"), stdin=b"through pct\n", timeout=30).stdout == b"through pct\n"
    local_proxmox.stop_container(200)
    with pytest.raises(ContainerNotRunning, match="container 200 is not running"):
        ct.run(Cmd("true"), timeout=30)


def test_run_with_state_gives_the_exec_and_the_container_state_in_one_trip(local_proxmox: FakeProxmox) -> None:
    host = LocalTransport("here")
    ct = PctTransport(host, 200)
    result, state = ct.run_with_state(bash(Script("echo inside", "exit 3")), timeout=30)
    # the exec's own exit code and output (the retry of a missing shipped copy reads them), pct status said running
    assert (result.exit_code, result.out, state) == (3, "inside\n", "running (but pct exec failed: inside)")
    result, state = ct.run_with_state(Cmd("echo", "ok"), timeout=30)
    assert (result.exit_code, result.out, state) == (0, "ok\n", "running")
    assert host.commands == 2 and ct.commands == 2  # one round trip each
    local_proxmox.stop_container(200)
    assert ct.run_with_state(Cmd("true"), timeout=30)[1] == ct.container_state(timeout=30) == "stopped"
    assert PctTransport(host, 4242).container_state(timeout=30) == "missing"
    # a host is no container: it has no container questions to answer; a container answers them itself
    assert host.container is None and ct.container is ct
    with pytest.raises(ContainerNotRunning, match="container 200 is not running"):
        ct.container.raise_for_container("CT 200 not running")


# -- timeouts and failures --------------------------------------------------------------------


def test_a_command_past_its_timeout_raises_and_the_next_command_works(tmp_path: Path, sshd: SshServer) -> None:
    pool = pool_for(write_inventory(tmp_path / "inv.yaml", sshd, ctid=None))
    host = pool.host("pve1")
    try:
        started = time.monotonic()
        with pytest.raises(CommandTimeout, match="ran past 1s"):
            host.run(Cmd("sleep", "60"), timeout=1)
        assert time.monotonic() - started < 20
        assert host.run(Cmd("echo", "again"), timeout=30).out == "again\n"
    finally:
        pool.close()


def test_a_local_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(CommandTimeout):
        LocalTransport().run(bash(Script(f"sleep 60 & echo $! > {pidfile}", "wait")), timeout=1)
    assert time.monotonic() - started < 20
    child = int(pidfile.read_text())
    wait_until(lambda: not is_alive(child), message="the timed-out command's child to be killed")


def test_a_dead_port_exits_3_after_bounded_retries(tmp_path: Path, sshd: SshServer) -> None:
    inv = edit_inventory(write_inventory(tmp_path / "inv.yaml", sshd), port=dead_port())
    started = time.monotonic()
    result = gpuops("status", "-i", str(inv), env={"GPUOPS_CONNECT_RETRY_TIME": "3"})
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result
    assert "connection refused" in result.stdout
    assert "gave up after 3s of retries" in result.stdout
    assert "hint: check the address and port" in result.stdout
    assert "Traceback" not in result.stderr
    assert 3 <= elapsed < 60  # it kept trying for the budget, then stopped


def test_a_dead_port_with_launch_exits_3_and_says_so_on_stderr(tmp_path: Path, sshd: SshServer) -> None:
    inv = edit_inventory(write_inventory(tmp_path / "inv.yaml", sshd), port=dead_port())
    pb = tmp_path / "pb.yaml"
    pb.write_text("name: x\ntarget: ct200\nlaunch: {session: x, command: 'true'}\n")
    result = gpuops("launch", "--yes", "-i", str(inv), "-p", str(pb), env={"GPUOPS_CONNECT_RETRY_TIME": "1"})
    assert result.returncode == 3, result
    first = result.stderr.splitlines()[0]
    assert re.fullmatch(r"gpuops: error: pve1: cannot connect to 127\.0\.0\.1:\d+: connection refused .*", first), first
    assert "Traceback" not in result.stderr


def test_a_dead_port_through_the_api_is_a_connect_error(tmp_path: Path, sshd: SshServer) -> None:
    inv = edit_inventory(write_inventory(tmp_path / "inv.yaml", sshd, ctid=None), port=dead_port())
    pool = pool_for(inv, retry_time=1)
    with pytest.raises(ConnectError, match="connection refused") as info:
        pool.host("pve1").run(Cmd("true"), timeout=30)
    assert info.value.exit_code == 3


def untrusted_key(folder: Path) -> Path:
    """A fresh ed25519 key that the bench's sshd does not trust."""
    key = folder / "untrusted_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    return key


def test_a_wrong_key_exits_3_at_once_without_retrying(tmp_path: Path, sshd: SshServer) -> None:
    key = untrusted_key(tmp_path)
    inv = edit_inventory(write_inventory(tmp_path / "inv.yaml", sshd), identity_file=str(key))
    started = time.monotonic()
    result = gpuops("status", "-i", str(inv), env={**clean_env(tmp_path), "GPUOPS_CONNECT_RETRY_TIME": "60"})
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result
    assert "ct200: unreachable: pve1: authentication failed" in result.stdout
    assert f"ct200: hint: check that {key} is authorised" in result.stdout
    assert elapsed < 30  # far below the 60 s retry budget: not retried

    def refused() -> int:
        log = sshd.log.read_text(errors="replace")
        return len(re.findall(r"(Connection closed|Disconnected) by authenticating user", log))

    wait_until(refused, message="sshd to log the refused login")
    assert refused() == 1  # one attempt, not a retry loop
    assert sshd.connection_count() == 0


def test_a_wrong_key_through_the_api_is_an_auth_error(tmp_path: Path, sshd: SshServer, no_agent: Path) -> None:
    key = untrusted_key(tmp_path)
    inv = edit_inventory(write_inventory(tmp_path / "inv.yaml", sshd, ctid=None), identity_file=str(key))
    pool = pool_for(inv, retry_time=60)
    started = time.monotonic()
    with pytest.raises(AuthError) as info:
        pool.host("pve1").connect()
    assert time.monotonic() - started < 30
    assert info.value.exit_code == 3


def test_a_refused_connect_is_retried_until_sshd_comes_up(tmp_path: Path, sshd: SshServer) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd, ctid=None)
    sshd.stop()  # same port and keys later: connections are refused until it starts again
    pool = pool_for(inv, retry_time=120)
    host: Any = pool.host("pve1")
    attempts: list[str] = []
    connect_once = host._connect_once

    def counting() -> Any:
        try:
            conn = connect_once()
        except Exception as exc:
            attempts.append(type(exc).__name__)
            raise
        attempts.append("ok")
        return conn

    host._connect_once = counting
    outcome: list[BaseException | str] = []

    def connect() -> None:
        try:
            outcome.append(host.run(Cmd("echo", "up"), timeout=30).out)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    try:
        wait_until(lambda: len(attempts) >= 2, timeout=60, message="two refused connection attempts")
        assert "ok" not in attempts
        sshd.start()
        worker.join(timeout=90)
        assert not worker.is_alive()
        assert outcome == ["up\n"], outcome
        assert attempts[-1] == "ok" and len(attempts) >= 3
        assert sshd.connection_count() == 1
    finally:
        pool.close()


# -- ~/.ssh/config ----------------------------------------------------------------------------


def test_ssh_config_alias_gives_hostname_user_port_and_key(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host pve-alias\n"
        f"  HostName {sshd.host}\n  User {sshd.user}\n  Port {sshd.port}\n  IdentityFile {sshd.client_key}\n"
    )
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "hosts": {"pve1": {"address": "pve-alias", "known_hosts": str(sshd.known_hosts)}},
        "targets": {"ct200": {"host": "pve1", "ctid": 200}},
    }))  # fmt: skip
    quick = {"SSH_AUTH_SOCK": "", "GPUOPS_CONNECT_RETRY_TIME": "0"}
    result = gpuops("status", "-i", str(inv), env={"HOME": str(home), **quick})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ct200: reachable via pve1, container 200 running\n")
    assert sshd.connection_count() == 1
    # Without that config the alias means nothing: proof that the file was what made it work.
    bare = tmp_path / "bare"
    bare.mkdir()
    result = gpuops("status", "-i", str(inv), env={"HOME": str(bare), **quick})
    assert result.returncode == 3
    assert "ct200: unreachable: pve1: cannot connect to pve-alias" in result.stdout


def test_ssh_config_user_known_hosts_file_is_the_default_known_hosts(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    elsewhere = tmp_path / "team_known_hosts"
    elsewhere.write_text(sshd.known_hosts_line() + "\n")
    (home / ".ssh" / "config").write_text(f"Host *\n  UserKnownHostsFile {elsewhere} ~/.ssh/known_hosts2\n")
    inv = tmp_path / "inv.yaml"
    entry = host_entry(sshd)
    del entry["known_hosts"]
    inv.write_text(yaml.safe_dump({"hosts": {"pve1": entry}, "targets": {"ct200": {"host": "pve1", "ctid": 200}}}))
    quick = {"SSH_AUTH_SOCK": "", "GPUOPS_CONNECT_RETRY_TIME": "0"}
    result = gpuops("status", "-i", str(inv), env={"HOME": str(home), **quick})
    assert result.returncode == 0, result.stdout + result.stderr
    # Without the config line the default ~/.ssh/known_hosts (empty here) applies: unknown key.
    (home / ".ssh" / "config").unlink()
    refused = gpuops("status", "-i", str(inv), env={"HOME": str(home), **quick})
    assert refused.returncode == 3
    assert "known_hosts: ~/.ssh/known_hosts" in refused.stdout, refused.stdout


def test_ssh_config_proxyjump_is_honoured(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host pve-alias\n  HostName {sshd.host}\n  User {sshd.user}\n  Port {sshd.port}\n"
        f"  IdentityFile {sshd.client_key}\n  ProxyJump jump-alias\n"
        f"Host jump-alias\n  HostName {bastion.host}\n  User {bastion.user}\n  Port {bastion.port}\n"
        f"  IdentityFile {bastion.client_key}\n"
    )
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n" + bastion.known_hosts_line() + "\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({
        "hosts": {"pve1": {"address": "pve-alias", "known_hosts": str(known)}},
        "targets": {"ct200": {"host": "pve1", "ctid": 200}},
    }))  # fmt: skip
    result = gpuops("status", "-i", str(inv), env={"HOME": str(home), "SSH_AUTH_SOCK": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ct200: reachable via pve1, container 200 running" in result.stdout
    assert bastion.connection_count() == 1 and sshd.connection_count() == 1
