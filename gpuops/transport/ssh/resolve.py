"""A host's SSH options as OpenSSH resolves them: `ssh -G [ARGS] HOST` (Include, Match, first value wins,
%-tokens), one call per distinct host and arguments, cached for the command; paramiko's parser where
there is no `ssh`. `ssh -G` only prints the configuration: it never connects."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from gpuops.errors import SshFileError, UsageError, os_reason
from gpuops.transport.ssh.head_start import Early

if TYPE_CHECKING:
    from gpuops.targets import Host

SSH_G_TIMEOUT = 30.0  # seconds; `Match exec` runs the user's commands, as ssh does
_cache: dict[tuple[str, ...], "Resolved"] = {}
_soon: dict[tuple[str, ...], Early[Resolved]] = {}  # resolutions started ahead of their first use
_lock = threading.Lock()
readers_used: set[str] = set()  # "OpenSSH (ssh -G)" and/or "paramiko": what -v reports


@dataclass(frozen=True)
class Resolved:
    """The options gpuops honours, as ssh resolved them for one destination."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]  # as written (~ unexpanded), in ssh's order
    known_hosts: str  # the first UserKnownHostsFile, ~ for the home folder
    known_hosts_files: tuple[str, ...]  # every UserKnownHostsFile, in ssh's order, ~ for the home folder
    strict: str  # StrictHostKeyChecking: yes, ask, accept-new, no/off
    proxy_jump: str  # "" when none
    proxy_command: str  # "" when none (%-tokens unexpanded)
    connect_timeout: float | None
    server_alive_interval: int
    host_key_alias: str
    control_path: str = ""  # ControlPath, expanded by ssh ("" when none)
    control_master: str = "no"  # ControlMaster: no, yes, auto, ask, autoask
    control_persist: str = "no"  # ControlPersist: no, yes, or a time
    identity_agent: str = ""  # IdentityAgent ("" when ssh's default, SSH_AUTH_SOCK)
    certificate_files: tuple[str, ...] = ()  # CertificateFile, in ssh's order


def user_config() -> str:
    """~/.ssh/config as $HOME names it (what gpuops has always read)."""
    return os.path.expanduser("~/.ssh/config")


def explicit_args(host: Host) -> tuple[str, ...]:
    """An inventory host's user and port as ssh options put first (first value wins, and `Match user` sees
    them), then its ssh args: the ARGS of `ssh -G ARGS HOST` for that host."""
    out: tuple[str, ...] = ()
    if host.user:
        out += ("-o", f"User={host.user}")
    if host.port:
        out += ("-o", f"Port={host.port}")
    return out + host.ssh_args


def resolve_soon(host: Host) -> None:
    """Start resolving an inventory host (`ssh -G`, a process of its own) in the background, so the
    command's imports overlap it; the first resolve() of that host waits for this answer."""
    dest, args = host.address or host.name, explicit_args(host)
    key = _key(dest, args)
    with _lock:
        if key not in _cache and key not in _soon:
            _soon[key] = Early(lambda: resolve(dest, args, _started=True))


def resolve_hosts_soon(hosts: Mapping[str, Host], names: Iterable[str]) -> None:
    """resolve_soon for each inventory host named, when it is an SSH host, and for the inventory jumps it goes
    through: the command's imports (status) or its reading of the playbook (validate) overlap them."""
    for name in dict.fromkeys(names):
        host, seen = hosts[name], set()
        while host.transport == "ssh" and host.name not in seen:
            seen.add(host.name)
            resolve_soon(host)
            if not host.jump or host.jump not in hosts:
                break
            host = hosts[host.jump]


def _key(dest: str, args: tuple[str, ...]) -> tuple[str, ...]:
    return (os.environ.get("HOME", ""), *args, "--", dest)


def resolve(dest: str, args: tuple[str, ...] = (), *, _started: bool = False) -> Resolved:
    """ssh's options for `dest` with `args` before it on ssh's command line (first value wins)."""
    key = _key(dest, args)
    with _lock:
        if key in _cache:
            return _cache[key]
        soon = None if _started else _soon.pop(key, None)
    if soon is not None:  # the resolution resolve_soon started: its answer (cached), or its error (once)
        early = soon.result()
        if early is not None:  # (None only where an answer was discarded, which no resolution is)
            return early
    _check_readable(user_config())
    ssh = shutil.which("ssh")
    if ssh:
        found, reader = _openssh(ssh, dest, args), "OpenSSH (ssh -G)"
    else:
        found, reader = _paramiko(dest, args), "paramiko (no ssh on PATH)"
    with _lock:
        readers_used.add(reader)
        _cache[key] = found
    return found


def _check_readable(path: str) -> None:
    """An unreadable ~/.ssh/config is said as such (ssh would refuse it too)."""
    if not os.path.exists(path):
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise SshFileError(path, f"cannot be read ({os_reason(exc)})",
                           hint="make it readable for the user gpuops runs as, or move it away") from None


def config_flag() -> tuple[list[str], str | None]:
    """ssh reads the passwd home's ~/.ssh/config; where $HOME differs, gpuops reads $HOME's, as it always has
    (given on ssh's stdin, its Include paths made absolute against $HOME: ssh would take a relative or ~/
    Include from the passwd home's ~/.ssh)."""
    home = _home()
    mine = user_config()
    if home and os.path.realpath(os.path.expanduser("~")) == os.path.realpath(home):
        return [], None
    if not os.path.exists(mine):
        return ["-F", "none"], None
    return ["-F", "/dev/stdin"], _rehomed(mine)


def _rehomed(path: str) -> str:
    """The config's text with its Include paths absolute against $HOME/.ssh (and ~/ against $HOME)."""
    import re

    with open(path, "rb") as fh:
        text = fh.read().decode("utf-8", "surrogateescape")
    ssh_dir = os.path.dirname(os.path.abspath(path))
    home = os.path.expanduser("~")

    def absolute(bare: str) -> str:
        if bare.startswith("~/"):
            bare = os.path.join(home, bare[2:])
        elif not bare.startswith(("/", "~")):
            bare = os.path.join(ssh_dir, bare)
        return config_word(bare)

    def line(found: re.Match[str]) -> str:
        return found.group(1) + " ".join(absolute(w) for w in split_config_words(found.group(2)))

    return re.sub(r"(?im)^(\s*include[\s=]+)(.*)$", line, text)


def config_word(word: str) -> str:
    """A word as ssh_config (and ssh's `-o NAME=VALUE`) reads it back whole: quoted when it holds a space,
    a quote or a backslash."""
    if word and not any(c.isspace() or c in "\"'\\" for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir.rstrip("/")
    except KeyError:
        return ""


def _tilde(path: str) -> str:
    """A path ssh expanded with the passwd home, written back with ~ (gpuops expands ~ with $HOME)."""
    home = _home()
    return "~" + path[len(home):] if home and (path == home or path.startswith(home + "/")) else path


def _openssh(ssh: str, dest: str, args: tuple[str, ...]) -> Resolved:
    if dest.startswith("-"):
        raise UsageError(f"ssh destination {dest!r} starts with '-'")
    config, text = config_flag()
    argv = [ssh, "-G", *config, *args, "--", dest]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="surrogateescape", timeout=SSH_G_TIMEOUT,
                              **({"input": text} if text is not None else {"stdin": subprocess.DEVNULL}))
    except subprocess.TimeoutExpired:
        raise UsageError(f"`ssh -G {dest}` took over {SSH_G_TIMEOUT:.0f} s (a `Match exec` command in ~/.ssh/config?)") from None
    if done.returncode != 0:
        reason = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise UsageError(f"ssh cannot read its configuration for {dest}: {reason}",
                         hint="`ssh -G " + " ".join([*args, dest]) + "` shows the same")
    options: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        name, _, value = line.partition(" ")
        options.setdefault(name.lower(), []).append(value)
    return _from_options(options, dest)


def _from_options(options: dict[str, list[str]], dest: str) -> Resolved:
    def one(name: str, default: str = "") -> str:
        return options.get(name, [default])[0]

    timeout = one("connecttimeout", "none")
    alive = one("serveraliveinterval", "0")
    known = tuple(_tilde(p) for p in ssh_words(one("userknownhostsfile", "~/.ssh/known_hosts")))
    proxy = one("proxycommand", "none")
    jump = one("proxyjump", "none")
    return Resolved(
        hostname=one("hostname", dest), port=int(one("port", "22")), user=one("user") or _local_user(),
        identity_files=tuple(_tilde(p) for p in options.get("identityfile", [])),
        known_hosts=known[0] if known else "~/.ssh/known_hosts",
        known_hosts_files=known or ("~/.ssh/known_hosts",),
        strict=one("stricthostkeychecking", "ask").lower(),
        proxy_jump="" if jump.lower() == "none" else jump,
        proxy_command="" if proxy.lower() == "none" else proxy,
        connect_timeout=float(timeout) if timeout.isdigit() else None,
        server_alive_interval=int(alive) if alive.isdigit() else 0,
        host_key_alias=one("hostkeyalias", ""),
        control_path="" if one("controlpath", "none").lower() == "none" else one("controlpath"),
        control_master=_control_master(one("controlmaster", "no")),
        control_persist=one("controlpersist", "no").lower(),
        identity_agent="" if one("identityagent", "none").lower() in ("none", "ssh_auth_sock") else one("identityagent"),
        certificate_files=tuple(_tilde(p) for p in options.get("certificatefile", [])),
    )


def _control_master(value: str) -> str:
    """ssh -G prints ControlMaster as true/false/auto/ask/autoask; the config spells them yes/no."""
    value = value.lower()
    return {"true": "yes", "false": "no"}.get(value, value)


def ssh_words(value: str) -> list[str]:
    """The words of a list value as `ssh -G` prints it (UserKnownHostsFile): newer OpenSSH quotes a word
    holding a space (`"/a b/kh" /c`); 9.2 prints it bare (`/a b/kh /c`), so there a word that does not
    start a path (/ or ~) continues the one before: a path's space is kept, a second file is a new word."""
    if '"' in value or "'" in value:
        return split_config_words(value)
    words: list[str] = []
    for word in value.split():
        if words and not word.startswith(("/", "~")):
            words[-1] += " " + word
        else:
            words.append(word)
    return words


def split_config_words(text: str) -> list[str]:
    """ssh_config's own word splitting (argv_split): whitespace separates, double or single quotes keep a
    word whole, a backslash escapes a quote, a backslash or (unquoted) a space; quotes are not part of the word."""
    words: list[str] = []
    word: list[str] = []
    quote, started, i = "", False, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and (text[i + 1] in "\\\"'" or (not quote and text[i + 1] == " ")):
            word.append(text[i + 1])
            started, i = True, i + 2
            continue
        if quote:
            if c == quote:
                quote = ""
            else:
                word.append(c)
        elif c in "\"'":
            quote, started = c, True
        elif c.isspace():
            if started:
                words.append("".join(word))
                word, started = [], False
        else:
            word.append(c)
            started = True
        i += 1
    if started:
        words.append("".join(word))
    return words


def _local_user() -> str:
    import getpass

    return getpass.getuser()


def _paramiko(dest: str, args: tuple[str, ...]) -> Resolved:
    """Where there is no ssh: the command-line options first, then paramiko's reading of ~/.ssh/config."""
    from gpuops.transport.ssh._paramiko import paramiko

    given = _given(args)
    path = given.pop("configfile", [user_config()])[0]
    config = paramiko.SSHConfig()
    if path != "none" and os.path.isfile(os.path.expanduser(path)):
        with open(os.path.expanduser(path), "rb") as fh:
            config = paramiko.SSHConfig.from_text(fh.read().decode("utf-8", "surrogateescape"))
    found = config.lookup(dest)
    options: dict[str, list[str]] = {k: list(v) for k, v in given.items()}
    for name, value in found.items():
        if name == "identityfile":
            options.setdefault(name, []).extend(value)
        elif name not in options:
            options[name] = [" ".join(value) if isinstance(value, list) else str(value)]
    return _from_options(options, dest)


def _given(args: tuple[str, ...]) -> dict[str, list[str]]:
    """ssh's -p -l -i -J -F -o of `args` as config options (first value wins; -i adds a key)."""
    flags = {"-p": "port", "-l": "user", "-i": "identityfile", "-J": "proxyjump", "-F": "configfile"}
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        flag, value = arg[:2], arg[2:]
        i += 1
        if flag not in flags and flag != "-o":
            continue
        if not value and i < len(args):
            value, i = args[i], i + 1
        if flag == "-o":
            name, _, value = value.partition("=") if "=" in value else value.partition(" ")
            name = name.strip().lower()
        else:
            name = flags[flag]
        if name == "identityfile":
            out.setdefault(name, []).append(value.strip())
        else:
            out.setdefault(name, [value.strip()])
    return out
