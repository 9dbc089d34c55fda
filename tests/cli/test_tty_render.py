"""On a terminal, rich renders gpuops' output: text that came from users, hosts or jobs is shown literally.

rich reads `[word]` as markup and `:name:` as an emoji code; a host-key hint for `[pve1.lan]:2222`
lost its host (`ssh-keygen -R ':2222'`), a warmup line `[rank0]: compiling` its rank. Each test
runs gpuops on a real pseudo-terminal (500 columns, nothing wraps) and reads the screen's text.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import termios
from pathlib import Path

import pytest
import yaml
from bench import FakeProxmox, LocalEnv, SshServer, wait_until, write_inventory
from bench.cli import REPO, argv

ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
LOCAL = str(REPO / "inventories" / "local.yaml")


class Terminal:
    """A command on a pseudo-terminal of 50 x 500 (or `columns` wide); what it shows, terminal escapes removed."""

    def __init__(self, args: list[str], columns: int = 500) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR") and (not k.startswith("GPUOPS_")
                                                                               or k.startswith("GPUOPS_FAKE"))}
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, start_new_session=True,
                                     env={**env, "TERM": "xterm-256color", "GPUOPS_CONNECT_RETRY_TIME": "0"})
        os.close(slave)
        self._master = master
        self._raw = bytearray()
        self._closed = False

    def _read(self) -> bool:
        """Take what the terminal has now; False once the other side is gone."""
        if not self._closed and select.select([self._master], [], [], 0.05)[0]:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every writer closed its end
                data = b""
            self._raw += data
            self._closed = not data
        return not self._closed

    @property
    def text(self) -> str:
        plain = ANSI.sub(b"", bytes(self._raw)).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return plain.decode("utf-8", "replace")

    def wait_for(self, needle: str, timeout: float = 60) -> None:
        wait_until(lambda: (self._read() or True) and (needle in self.text or self._closed), timeout=timeout,
                   message=lambda: f"{needle!r} on the terminal; so far:\n{self.text[-2000:]}")

    def finish(self, timeout: float = 120) -> int:
        """Its exit code, once it exited and what it wrote is read (a child it left may hold the terminal)."""
        try:
            wait_until(lambda: (self._read() or True) and self.proc.poll() is not None, timeout=timeout,
                       message=lambda: f"gpuops to exit; so far:\n{self.text[-2000:]}")
            while self._read() and select.select([self._master], [], [], 0.2)[0]:
                pass
            return self.proc.returncode
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self._master)


def gpuops_on_a_terminal(*args: str, prefix: tuple[str, ...] = (), columns: int = 500) -> tuple[int, str]:
    term = Terminal([*prefix, *argv(*args)], columns)
    return term.finish(), term.text


# -- status: table cells and lines ---------------------------------------------------------------


def test_status_shows_a_process_name_with_brackets_and_colons_as_it_is(local_env: LocalEnv) -> None:
    name = "[rank0] python :fire:"
    local_env.gpus.register(os.getpid(), 3, 1234, name=name)
    code, text = gpuops_on_a_terminal("status", "-i", LOCAL)
    assert code == 0, text
    assert f"{os.getpid()} {name} 1234 MiB" in text


def test_health_on_a_60_column_terminal_is_a_table_with_each_cause_wrapped_under_it(local_env: LocalEnv) -> None:
    """`gpuops health` on a narrow terminal: a row per GPU with its verdict, nothing wider than the terminal, and the
    cause of a verdict with NVIDIA's action in words under the table (NO_COLOR or not, the same words)."""
    gpus = local_env.gpus
    gpus.set_health(3, ecc_uncorrected_volatile=2)
    gpus.set_health(4, slowdown=["hw_thermal_slowdown"])
    code, text = gpuops_on_a_terminal("health", "-i", LOCAL, columns=60)
    assert code == 10, text  # GPU 3 needs a reset
    lines = [line.rstrip() for line in text.splitlines()]
    assert max(len(line) for line in lines) <= 60, "\n".join(lines)
    assert any(re.fullmatch(r"GPU\s+┃\s+verdict\s+┃\s+ECC\s+┃\s+remap\s+┃\s+clocks\s+┃\s+PCIe\s+┃\s+°C", line)
               for line in lines), text
    rows = {int(m.group(1)): m.group(2) for line in lines if (m := re.match(r"(\d)\s+│ (\S+)", line))}
    assert (rows[0], rows[3], rows[4]) == ("ok", "needs", "warn"), rows  # "needs reset" wraps in its column
    words = " ".join(line.strip() for line in lines)
    assert f"GPU 3 ({gpus.bus_id(3)}, " in words and "NEEDS RESET: 2 uncorrected ECC error(s)" in words, words
    assert "nvidia-smi -r -i " + gpus.bus_id(3) in words and "WARN: clocks slowed: hw_thermal_slowdown" in words


@pytest.fixture
def pve1_lan(tmp_path: Path) -> tuple[str, ...]:
    """A prefix that runs a command where the name pve1.lan means 127.0.0.1 (its own /etc/hosts, bind-mounted
    in a private mount namespace), so known_hosts names the bench sshd `[pve1.lan]:PORT` as a real lab would."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs a private mount namespace (unshare -m, as root)")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 pve1.lan\n")
    return ("unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts))


def lan_inventory(tmp_path: Path, server: SshServer, known: Path) -> Path:
    inv = write_inventory(tmp_path / "inv.yaml", server, known_hosts=known)
    data = yaml.safe_load(inv.read_text())
    data["hosts"]["pve1"]["address"] = "pve1.lan"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    return inv


def test_the_changed_key_hint_for_a_host_with_a_port_is_printed_exactly(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, pve1_lan: tuple[str, ...]
) -> None:
    name = f"[pve1.lan]:{sshd.port}"
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line().replace(f"[{sshd.host}]:{sshd.port}", name) + "\n")
    sshd.rotate_host_key()
    code, text = gpuops_on_a_terminal("status", "-i", str(lan_inventory(tmp_path, sshd, known)), prefix=pve1_lan)
    assert code == 3, text
    assert f"unreachable: pve1: HOST KEY CHANGED for {name}: known_hosts has ssh-ed25519" in text
    assert f"hint: if the host was really re-installed, remove the old key with `ssh-keygen -R '{name}' -f {known}`" in text
    removed = subprocess.run(["ssh-keygen", "-R", name, "-f", str(known)], capture_output=True, text=True, timeout=30)
    assert f"Host {name} found" in removed.stdout  # the hint names the entry that is there


def test_the_unknown_key_error_names_the_host_with_its_port(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, pve1_lan: tuple[str, ...]
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    code, text = gpuops_on_a_terminal("status", "-i", str(lan_inventory(tmp_path, sshd, known)), prefix=pve1_lan)
    assert code == 3, text
    assert f"unreachable: pve1: unknown host key for [pve1.lan]:{sshd.port} (ssh-ed25519 {sshd.host_key_fingerprint})" in text


# -- launch: the warmup progress -------------------------------------------------------------------


def test_a_warmup_line_with_brackets_is_shown_as_it_is(local_env: LocalEnv, tmp_path: Path) -> None:
    flag = tmp_path / "go-on"
    line = "[rank0]: compiling :fire: graph {gpu}"
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({
        "name": "tty", "target": "local",
        "warmup": {"gpus": [0], "timeout": 120,
                   "command": f"echo '{line}'; while [ ! -e {flag} ]; do sleep 0.05; done"},
        "launch": {"session": "ttytest", "command": "true"},
        "watch": {"stall_timeout": 0},
    }))  # fmt: skip
    term = Terminal(argv("launch", "--yes", "-i", LOCAL, "-p", str(pb)))
    try:
        term.wait_for("compiling")
        flag.touch()
    finally:
        code = term.finish()
    assert code == 0, term.text
    assert line.format(gpu=0) in term.text
