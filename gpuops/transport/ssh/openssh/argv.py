"""The user's `ssh` command line for a host, planned before anything connects: their config and ssh args as ssh
reads them, gpuops' host-key policy on top (StrictHostKeyChecking, UserKnownHostsFile quoted as ssh reads it),
an inventory jump chain as nested `ssh -W` ProxyCommands (each hop with its own known_hosts), and the
ControlMaster the commands share: the user's where their config has one and checks host keys as strictly as
the inventory, else gpuops' own, its socket in a private folder no other user can swap (dirs.py), named by a
hash of the connection so it fits the 104-byte socket limit; where there is no such folder, no master at all."""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Mapping

from gpuops.errors import os_reason
from gpuops.localfiles import unswappable
from gpuops.targets import Host
from gpuops.transport.ssh.openssh.dirs import SOCKET_NAME, SOCKET_SUFFIX, SUN_PATH, control_dir, say_no_master
from gpuops.transport.ssh.openssh.fail import HopView
from gpuops.transport.ssh.plan import Hop, identity_file_path, known_hosts_name, plan_chain, read_known_hosts
from gpuops.transport.ssh.resolve import Resolved, config_flag, config_word, explicit_args, resolve

CONTROL_PERSIST = 60  # seconds a master of gpuops' own stays up after its last command (Ansible's default too)


@dataclass
class SshPlan:
    """How one host is reached with the ssh binary."""

    ssh: str
    label: str
    dest: str
    args: list[str]  # the options before `-- DEST` every ssh of this host gets
    control_path: str  # "": no master (no private folder short enough): each command logs in on its own
    ours: bool  # gpuops' own master; else the user's (never stopped by gpuops), or none
    master_args: list[str]  # what making the master adds (ControlPersist, keepalives)
    hops: list[HopView]  # the jumps first, the host last: whose words are whose in a failure
    hop_logs: list[str] = field(default_factory=list)  # each jump's ssh -E file while connecting
    connect_args: list[str] = field(default_factory=list)  # args, the jumps writing to their logs
    folder: str = ""  # the private folder of the sockets and logs

    def new_log(self) -> str:
        """A fresh file (0600, in the private folder) for one ssh's own words (-E)."""
        return _hop_log(self.folder)

    def command(self, *, log: str) -> list[str]:
        """ssh's argv up to the remote command: through the master, never making one, its own words in `log`
        (without a master: a login of its own, with the master's keepalives)."""
        own = [] if self.control_path else self.master_args  # no master: no ControlPersist there, keepalives only
        return [self.ssh, *self.args, *own, "-T", "-o", "ControlMaster=no", "-o", f"ControlPath={self._path()}",
                "-o", "LogLevel=ERROR", "-E", log, "--", self.dest]

    def master(self) -> list[str]:
        """ssh's argv that makes the master and returns once it listens (after authentication); without a
        master, one login that runs `true`: the host's key and the login checked, failures said, as a master's."""
        if not self.control_path:
            return [self.ssh, *self.connect_args, *self.master_args, "-o", "LogLevel=DEBUG1", "-T", "-o",
                    "ControlMaster=no", "-o", "ControlPath=none", "--", self.dest, "true"]
        return [self.ssh, *self.connect_args, *self.master_args, "-o", "LogLevel=DEBUG1", "-M", "-N", "-f", "-o",
                f"ControlPath={self._path()}", "--", self.dest]

    def _path(self) -> str:
        return _escape(self.control_path) if self.control_path else "none"

    def stop(self) -> list[str]:
        """ssh's argv that makes gpuops' master take no new commands (running ones finish) and drop its socket."""
        return [self.ssh, *self.args, "-o", f"ControlPath={_escape(self.control_path)}", "-O", "stop", "--", self.dest]


def plan(ssh: str, host: Host, hosts: Mapping[str, Host]) -> SshPlan:
    """The argv of every hop, the chain nested as ProxyCommands, and whose master the commands use."""
    hops = plan_chain(host, hosts)  # ~/.ssh/config read (and an unreadable one said) first
    dirs = control_dir(host.name)
    folder = dirs.path
    cfg = _config_args(folder)
    founds = [resolve(hop.host.address or hop.host.name, explicit_args(hop.host)) for hop in hops]
    for hop in hops:  # a missing key, or a known_hosts file that cannot be used, is said before anything connects
        if hop.host.identity_file:
            identity_file_path(hop.host)
        read_known_hosts(hop.known_hosts, hop.host.name)
        hop.cannot_record = _ready_to_record(hop) if hop.policy == "accept-new" else ""
    args = _chain(ssh, cfg, hops, founds, None)
    logs = [_hop_log(folder) for _ in hops[:-1]]
    path, ours = _control(founds[-1], hops, dirs.path if dirs.sockets else "", ssh, args, _dest(hops[-1]))
    if not path:
        say_no_master(host.name, dirs)
    master_args = ["-o", f"ControlPersist={CONTROL_PERSIST}"] if ours else []
    if not founds[-1].server_alive_interval:  # a dead peer noticed within 15 s, where the user set no keepalive
        master_args += ["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    return SshPlan(ssh, host.name, _dest(hops[-1]), args, path, ours, master_args,
                   [_view(h, f) for h, f in zip(hops, founds, strict=True)], logs, _chain(ssh, cfg, hops, founds, logs),
                   folder)


def _chain(ssh: str, cfg: list[str], hops: list[Hop], founds: list[Resolved], logs: list[str] | None) -> list[str]:
    """The last hop's options; each hop before it is the ProxyCommand of the next (`ssh ... -W [%h]:%p HOP`),
    writing its own words to its log while connecting (`logs`), else at LogLevel ERROR."""
    proxy = ""
    for i, (hop, found) in enumerate(zip(hops, founds, strict=True)):
        args = [*cfg, *_hop_args(hop, found)] + (["-o", f"ProxyCommand={proxy}"] if proxy else [])
        if i == len(hops) - 1:
            return args
        log = ["-o", "LogLevel=DEBUG1", "-E", logs[i]] if logs else ["-o", "LogLevel=ERROR"]
        jump = [ssh, *args, "-o", "ControlMaster=no", *log]
        proxy = f"{_escape(shlex.join(jump))} -W '[%h]:%p' -- {_escape(shlex.quote(_dest(hop)))}"
    raise AssertionError("a chain has at least one hop")


def _dest(hop: Hop) -> str:
    return hop.host.address or hop.host.name


def _hop_args(hop: Hop, found: Resolved) -> list[str]:
    """One hop's options: the inventory's user, port, ssh args and key, then gpuops' host-key policy."""
    args = list(explicit_args(hop.host))
    if hop.host.identity_file:
        args += ["-i", _escape(os.path.expanduser(str(hop.host.identity_file)))]
    files = [hop.host.known_hosts] if hop.host.known_hosts else list(found.known_hosts_files)
    known = " ".join(config_word(_escape(os.path.expanduser(f))) for f in files)
    # accept-new where the new key can be recorded; else strict, and an unknown key is said as unrecordable
    strict = "accept-new" if hop.policy == "accept-new" and not hop.cannot_record else "yes"
    return args + ["-o", f"StrictHostKeyChecking={strict}", "-o", f"UserKnownHostsFile={known}", "-o", "HashKnownHosts=no",
                   "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(hop.host.connect_timeout))}"]


def _view(hop: Hop, found: Resolved) -> HopView:
    return HopView(hop.host.name, known_hosts_name(hop.hostname, hop.port), hop.known_hosts,
                   identity_file=hop.host.identity_file, identity_agent=found.identity_agent,
                   certificate_files=found.certificate_files, user=hop.user, cannot_record=hop.cannot_record)


def _ready_to_record(hop: Hop) -> str:
    """Make the known_hosts file ready for ssh to append a new key as gpuops always did (its folder made, a
    last line without its newline ended, or ssh glues the entry onto it); why it cannot take one, or ""."""
    path = os.path.expanduser(hop.known_hosts)
    folder = os.path.dirname(path)
    try:
        if folder:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        return os_reason(exc)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")
    finally:
        os.close(fd)
    return ""


def _escape(word: str) -> str:
    """A word ssh expands %-tokens in (ProxyCommand, ControlPath, UserKnownHostsFile, IdentityFile), kept as is."""
    return word.replace("%", "%%")


def _control(found: Resolved, hops: list[Hop], folder: str, ssh: str, args: list[str], dest: str) -> tuple[str, bool]:
    """The user's ControlPath where their master is open, or where their config makes one, and it may carry
    gpuops' commands (checked before anything connects to it); else gpuops' own in `folder`; else ("" where
    there is no folder) none."""
    theirs = found.control_path
    if theirs and _fits(theirs) and _as_strict(found, hops) and (found.control_master != "no" or master_alive(theirs)):
        return theirs, False
    if not folder:
        return "", False
    digest = hashlib.sha256("\0".join([ssh, *args, "--", dest]).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(folder, digest[:SOCKET_NAME]), True


def _fits(path: str) -> bool:
    """A socket path ssh can bind (short enough: it binds PATH.<16 random characters> first, then renames it; in a
    folder that exists, ssh makes none) where no other user can swap the socket or serve one of their own."""
    size = len(path.encode("utf-8", "surrogateescape"))
    return size + SOCKET_SUFFIX < SUN_PATH and os.path.isdir(os.path.dirname(path)) and not unswappable(path)


def _as_strict(found: Resolved, hops: list[Hop]) -> bool:
    """Whether the user's ssh checks the host's key at least as strictly as the inventory asks: their master
    (opened by their settings, not gpuops') is then no way around a known_hosts the inventory pins. Their
    StrictHostKeyChecking refuses changed keys (not no/off), and unknown ones too where the policy is strict;
    where the inventory names known_hosts files (the host's, a jump's), their UserKnownHostsFile is that file."""
    strict = found.strict.lower()
    if strict in ("no", "off", "false") or (hops[-1].policy == "strict" and strict == "accept-new"):
        return False
    if any(hop.host.known_hosts for hop in hops[:-1]):
        return False  # their master does not go through the inventory's jumps, checked against their files
    pinned = hops[-1].host.known_hosts
    if not pinned:
        return True
    theirs = {os.path.realpath(os.path.expanduser(f)) for f in found.known_hosts_files}
    return theirs == {os.path.realpath(os.path.expanduser(pinned))}


def master_alive(path: str) -> bool:
    """Whether a master listens on that socket (a stale file refuses at once)."""
    import socket

    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def _config_args(folder: str) -> list[str]:
    """`-F FILE` where gpuops reads $HOME's ~/.ssh/config rather than the passwd home's (sshresolve.config_flag):
    the rehomed text, written once per content into the private folder."""
    flag, text = config_flag()
    if text is None:
        return flag
    data = text.encode("utf-8", "surrogateescape")
    path = os.path.join(folder, "config-" + hashlib.sha256(data).hexdigest()[:16])
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".config-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    return ["-F", path]


def _hop_log(folder: str) -> str:
    fd, path = tempfile.mkstemp(dir=folder, prefix="ssh-", suffix=".log")
    os.close(fd)
    return path
