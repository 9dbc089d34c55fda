"""An Ansible host's ssh arguments as ssh reads them: each one honoured (it reaches `ssh -G` with the
host, so -p, -l, -i, -F and -o mean what they mean to ssh), harmless, or an error at its place."""

from __future__ import annotations

import os
import shlex

from gpuops.config.ansible.tree import HostValueError, Var, first_set
from gpuops.errors import ConfigError
from gpuops.position import Mark

# The order Ansible puts them on ssh's argv (ansible_ssh_args replaces ansible.cfg's ssh_args, which
# gpuops does not read); the inventory's port and user come first in gpuops (Ansible: after ssh_args).
SSH_ARGS = ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args")
# -o options that decide where, as whom, with which key and trust gpuops connects: resolved by `ssh -G`.
HONOURED = {"hostname", "port", "user", "identityfile", "userknownhostsfile", "stricthostkeychecking", "proxyjump",
            "proxycommand", "connecttimeout", "serveraliveinterval"}  # fmt: skip
# -o options that change nothing gpuops does (multiplexing, logging, prompts, other auth methods).
HARMLESS = {"controlmaster", "controlpersist", "controlpath", "compression", "loglevel", "serveralivecountmax",
            "tcpkeepalive", "batchmode", "identitiesonly", "preferredauthentications", "passwordauthentication",
            "kbdinteractiveauthentication", "challengeresponseauthentication", "gssapiauthentication",
            "gssapidelegatecredentials", "hashknownhosts", "checkhostip", "visualhostkey", "updatehostkeys",
            "addkeystoagent", "connectionattempts", "requesttty", "forwardx11", "forwardx11trusted", "escapechar",
            "exitonforwardfailure", "clearallforwardings", "numberofpasswordprompts", "pubkeyauthentication"}  # fmt: skip
VALUED = {"-p", "-l", "-i", "-J", "-F", "-o"}  # ssh flags with a value that gpuops passes on
_SSH_VALUED = set("BbcDEeFIiJLlmOopPQRSWw")
_QUIET_FLAGS = set("CqvTtnxak")  # no effect on what gpuops runs or where


def ssh_args(v: dict[str, Var]) -> tuple[tuple[str, ...], dict[str, tuple[str, Mark]]]:
    """The ssh args (ssh_args, common, extra) as argv for `ssh -G`, checked; and their -o / -J values by
    lower-case name (the first one given wins, as in ssh) with where each was written."""
    argv: list[str] = []
    options: dict[str, tuple[str, Mark]] = {}
    for name in SSH_ARGS:
        var = first_set(v, name)
        if var is None:
            continue
        text = var.text("ssh arguments")
        try:
            tokens = shlex.split(text)
        except ValueError as exc:
            raise ConfigError(var.mark, f"cannot read {name}: {exc} (check its quotes)") from None
        argv += _checked(tokens, text, var, name, options)
    return tuple(argv), options


def _checked(tokens: list[str], text: str, var: Var, name: str, options: dict[str, tuple[str, Mark]]) -> list[str]:
    out: list[str] = []
    pos = 0
    i = 0
    while i < len(tokens):
        token = tokens[i]
        at = text.find(token[:2] if token.startswith("-") else token, pos)
        pos = max(pos, at + 1)
        mark = var.mark_at(at if at >= 0 else 0)
        i += 1
        if not token.startswith("-") or len(token) < 2:
            raise ConfigError(mark, f"{name}: {token!r} is not an ssh option (gpuops takes options only here)")
        flag = token[:2]
        if flag[1] not in _SSH_VALUED:
            bad = [c for c in token[1:] if c not in _QUIET_FLAGS]
            if bad:
                raise HostValueError(mark, f"{name}: ssh's -{bad[0]} is not honoured by gpuops (remove it)")
            continue
        value = token[2:]
        if not value:
            if i >= len(tokens):
                raise ConfigError(mark, f"{flag} at the end of {name} needs a value")
            value, i = tokens[i], i + 1
        if flag not in VALUED:
            raise HostValueError(mark, f"{name}: ssh's {flag} is not honoured by gpuops (remove it)")
        if flag in ("-o", "-J"):
            key, sep, val = ("proxyjump", "", value) if flag == "-J" else _option(value)
            key = key.strip().lower()
            if key not in HONOURED and key not in HARMLESS:
                raise HostValueError(mark, f"{name}: ssh option {key!r} is not honoured by gpuops (remove it; gpuops "
                                        f"honours {', '.join(sorted(HONOURED))})")
            if key == "forwardagent" or key not in HONOURED:
                continue  # harmless: not passed on
            options.setdefault(key, (val.strip(), mark))
        out += [flag, value]
    return out


def _option(value: str) -> tuple[str, str, str]:
    return value.partition("=") if "=" in value.split(" ")[0] or " " not in value else value.partition(" ")


def proxy_command(command: str, mark: Mark) -> tuple[str, str | None] | None:
    """`ssh [-q] [-p P] [-l U] [-i KEY] -W %h:%p [user@]host` -> (the jump as [user@]host[:port], KEY);
    None for any other command, which gpuops runs as ssh runs a ProxyCommand."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(mark, f"cannot read the ProxyCommand: {exc}") from None
    if not argv or os.path.basename(argv[0]) != "ssh" or "-W" not in argv:
        return None
    values: dict[str, str] = {}
    dest = None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-W", "-p", "-l", "-i") and i + 1 < len(argv):
            values[arg], i = argv[i + 1], i + 2
        elif arg.startswith("-") and all(c in _QUIET_FLAGS for c in arg[1:]):
            i += 1
        elif dest is None and not arg.startswith("-"):
            dest, i = arg, i + 1
        else:
            return None
    if dest is None or values.get("-W") != "%h:%p":
        return None
    spec = (f"{values['-l']}@" if "-l" in values and "@" not in dest else "") + dest
    if "-p" in values:
        spec += f":{values['-p']}"
    return spec, values.get("-i")
