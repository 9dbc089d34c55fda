"""A real OpenSSH server on 127.0.0.1 with its own keys and config: the fake Proxmox host's sshd."""

from __future__ import annotations

import getpass
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

from bench import fakes, procs

SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 20.0  # a loaded 2-core CI machine can take seconds to start sshd

CONFIG = """\
Port {port}
ListenAddress {listen}
AddressFamily inet
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
UsePAM no
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin yes
AllowTcpForwarding yes
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 200
MaxSessions 100
LogLevel INFO
Subsystem sftp internal-sftp
SetEnv {setenv}
{extra}"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class SshServer:
    """`sshd -D` on 127.0.0.1:<free port>, trusting one generated client key, logging to a file.

    Every session gets PATH with the stand-ins' bin dir first and the fake root's variables
    (see bench.fakes.host_env); HOME is the fake host's home, so nothing lands in the real one.
    `host` is the address sshd listens on (and clients use); `launcher` is an argv prefix sshd
    runs under, e.g. `ip netns exec NAME` (see bench.netns) for a host the tests can cut off.
    """

    def __init__(
        self, fake_root: str | os.PathLike[str] | None = None, *, host: str = "127.0.0.1", launcher: Sequence[str] = (),
        extra_config: str = "",
    ) -> None:
        self.fake_root = Path(fake_root) if fake_root is not None else fakes.make_root()
        fakes.ensure_host(self.fake_root)
        self.dir = self.fake_root / "sshd"
        self.dir.mkdir(exist_ok=True)
        self.host = host
        self.launcher = list(launcher)
        self.extra_config = extra_config  # more sshd_config lines (e.g. TrustedUserCAKeys); restart() applies a change
        self.user = getpass.getuser()
        self.port = 0
        self.host_key = self.dir / "ssh_host_ed25519_key"
        self.client_key = self.dir / "id_ed25519"
        self.authorized_keys = self.dir / "authorized_keys"
        self.known_hosts = self.dir / "known_hosts"
        self.config = self.dir / "sshd_config"
        self.pid_file = self.dir / "sshd.pid"
        self.log = self.dir / "sshd.log"
        self.host_key_fingerprint = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._frozen: list[int] = []
        _keygen(self.client_key, "gpuops-bench-client")
        self.authorized_keys.write_text(Path(f"{self.client_key}.pub").read_text())
        self._new_host_key()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "SshServer":
        """Start sshd (on a new free port the first time, the same port on a restart)."""
        if self._proc is not None:
            raise RuntimeError("sshd is already running")
        if os.geteuid() == 0:
            # Privilege separation needs its empty chroot dir when sshd runs as root.
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        fixed = self.port != 0
        for _attempt in range(1 if fixed else 5):
            if not fixed:
                self.port = _free_port()
            self._write_config()
            if self._launch():
                self._write_known_hosts()
                return self
            if fixed:
                break
        raise RuntimeError(f"sshd did not start on {self.host}:{self.port}; log:\n{self._log_tail()}")

    def stop(self) -> None:
        """Stop the listener and every connection it served (their sshd processes, not user commands)."""
        self.thaw()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        workers = self._sshd_descendants(proc.pid)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        procs.kill_all(workers)

    def restart(self) -> None:
        """Stop and start again on the same port with the same keys (clients see the connection drop)."""
        self.stop()
        self.start()

    def rotate_host_key(self) -> None:
        """Give the server a new host key and restart it; known_hosts keeps the old key."""
        self._new_host_key()
        if self._proc is not None:
            self.restart()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- connections ----------------------------------------------------------------------
    def kill_connections(self) -> int:
        """Kill the per-connection sshd processes (clients see the connection drop); return how many.

        The listener keeps running and the users' commands are left alone, as when a link drops.
        """
        if self._proc is None:
            return 0
        conns = _children(self._proc.pid)
        procs.kill_all([p for pid in conns for p in self._sshd_descendants(pid)] + conns)
        return len(conns)

    def freeze(self, *, connections_only: bool = False) -> list[int]:
        """SIGSTOP sshd: the host stops answering while TCP stays up (the kernel still accepts and acks).

        Every connection's sshd processes are stopped (a silent peer), and unless `connections_only`
        the listener too (new clients connect but never see a banner). thaw() resumes; stop() thaws first.
        """
        if self._proc is None:
            return []
        pids = self._sshd_descendants(self._proc.pid) + ([] if connections_only else [self._proc.pid])
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        self._frozen += pids
        return pids

    def thaw(self) -> None:
        """SIGCONT whatever freeze() stopped."""
        pids, self._frozen = self._frozen, []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def connection_count(self) -> int:
        """How many client connections authenticated so far (the "Accepted publickey" lines in the log)."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return 0
        return len(re.findall(r"Accepted publickey for ", text))

    def ssh(self, cmd: str, timeout: float = 30, *, input: str | None = None, options: list[str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run `cmd` on the server with the real OpenSSH client, strict about the host key."""
        return subprocess.run(
            self.ssh_argv(*(options or [])) + [cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def ssh_argv(self, *options: str) -> list[str]:
        """The ssh client command line for this server (append the remote command).

        `options` come first: for each option ssh uses the first value it is given.
        """
        return [
            "ssh", *options, "-F", "/dev/null", "-i", str(self.client_key), "-p", str(self.port),
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=15", "-o", "LogLevel=ERROR",
            f"{self.user}@{self.host}",
        ]  # fmt: skip

    def known_hosts_line(self) -> str:
        """`[127.0.0.1]:PORT ssh-ed25519 AAAA...` for the current host key."""
        key_type, key = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"[{self.host}]:{self.port} {key_type} {key}"

    # -- internals ------------------------------------------------------------------------
    def _new_host_key(self) -> None:
        _keygen(self.host_key, "gpuops-bench-host")
        out = subprocess.run(
            ["ssh-keygen", "-l", "-E", "sha256", "-f", f"{self.host_key}.pub"],
            check=True, capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
        self.host_key_fingerprint = out.split()[1]

    def _write_config(self) -> None:
        setenv = " ".join(shlex.quote(f"{k}={v}") for k, v in fakes.host_env(self.fake_root).items())
        self.config.write_text(
            CONFIG.format(
                port=self.port,
                listen=self.host,
                host_key=self.host_key,
                pid_file=self.pid_file,
                authorized_keys=self.authorized_keys,
                setenv=setenv,
                extra=self.extra_config + ("\n" if self.extra_config and not self.extra_config.endswith("\n") else ""),
            )
        )
        check = subprocess.run([SSHD, "-t", "-f", str(self.config)], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"sshd -t rejected {self.config}:\n{check.stderr}")

    def _launch(self) -> bool:
        """Start sshd and wait for its banner; False when it exited (e.g. the port was taken meanwhile)."""
        with self.log.open("ab") as log:
            log.write(f"--- gpuops bench: starting sshd on port {self.port} ---\n".encode())
        self._proc = subprocess.Popen(
            [*self.launcher, SSHD, "-D", "-e", "-f", str(self.config), "-E", str(self.log)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                return False
            probe = self._banner()
            if probe is not None:
                self._quiet_after(probe, deadline)
                return True
            time.sleep(0.05)
        self._proc.kill()
        self._proc.wait()
        self._proc = None
        return False

    def _banner(self) -> int | None:
        """The local port of a connection that got sshd's banner, or None."""
        try:
            with socket.create_connection((self.host, self.port), timeout=2) as s:
                s.settimeout(5)
                return s.getsockname()[1] if s.recv(64).startswith(b"SSH-") else None
        except OSError:
            return None

    def _quiet_after(self, probe: int, deadline: float) -> None:
        """Wait for sshd to log the banner probe's close, so a test that snapshots the log sees no late write.

        sshd's child for the probe logs `Connection closed by 127.0.0.1 port N` (older releases: `Did not
        receive identification string from ... port N`) some time after the close; on a loaded machine,
        after the test has started. Without the line by the deadline, start goes on: the log is then
        merely not settled, which only a snapshot of it would notice.
        """
        needle = f"{self.host} port {probe}"
        while time.monotonic() < deadline:
            if needle in self.log.read_text(errors="replace"):
                return
            time.sleep(0.02)

    def _write_known_hosts(self) -> None:
        if not self.known_hosts.exists():
            self.known_hosts.write_text(self.known_hosts_line() + "\n")

    def _sshd_descendants(self, pid: int) -> list[int]:
        found = []
        for child in _children(pid):
            if _cmdline(child).startswith("sshd"):
                found.append(child)
                found += self._sshd_descendants(child)
        return found

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except FileNotFoundError:
            return "(no log)"

    def __enter__(self) -> "SshServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SshServer({self.user}@{self.host}:{self.port}, root={self.fake_root})"
