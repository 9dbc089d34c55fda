"""What gpuops reads of an Ansible host's ssh arguments: -o options, -J hops, an `ssh -W` ProxyCommand."""

from __future__ import annotations

import os
import re
import shlex

from gpuops.config.ansible.tree import Var, first_set
from gpuops.errors import ConfigError, Mark

SSH_ARGS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")  # the order Ansible puts them on ssh's argv
_FLAGS = re.compile(r"-[46AaCqTvxNn]+\Z")  # ssh flags without an argument, allowed in a ProxyCommand


def ssh_options(v: dict[str, Var]) -> dict[str, tuple[str, Mark]]:
    """-o Key=Value / -o 'Key Value' / -J hops from the ssh args; the first one given wins, as in ssh."""
    options: dict[str, tuple[str, Mark]] = {}
    for name in SSH_ARGS:
        var = first_set(v, name)
        if var is None:
            continue
        try:
            argv = shlex.split(var.text("ssh arguments"))
        except ValueError as exc:
            raise ConfigError(var.mark, f"cannot read {name}: {exc} (check its quotes)") from None
        i = 0
        while i < len(argv):
            flag, i = argv[i][:2], i + 1
            if flag not in ("-o", "-J"):
                continue
            arg = argv[i - 1][2:]
            if not arg:
                if i >= len(argv):
                    raise ConfigError(var.mark, f"{flag} at the end of {name} needs a value")
                arg, i = argv[i], i + 1
            if flag == "-J":
                key, value = "proxyjump", arg
            else:
                key, _, value = arg.partition("=") if "=" in arg else arg.partition(" ")
            options.setdefault(key.strip().lower(), (value.strip(), var.mark))
    return options


def proxy_command(command: str, mark: Mark) -> tuple[str, str | None]:
    """`ssh [-q] [-p P] [-l U] [-i KEY] -W %h:%p [user@]host` -> (the jump as [user@]host[:port], KEY)."""
    form = "write -o ProxyJump=[user@]host[:port] instead, or a ProxyCommand of the form `ssh -W %h:%p [user@]host`"
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError(mark, f"cannot read the ProxyCommand: {exc}") from None
    if not argv or os.path.basename(argv[0]) != "ssh" or "-W" not in argv:
        raise ConfigError(mark, f"ProxyCommand {command!r} is not read by gpuops: {form}")
    values: dict[str, str] = {}
    dest = None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-W", "-p", "-l", "-i") and i + 1 < len(argv):
            values[arg], i = argv[i + 1], i + 2
        elif _FLAGS.match(arg):
            i += 1
        elif dest is None and not arg.startswith("-"):
            dest, i = arg, i + 1
        else:
            raise ConfigError(mark, f"ProxyCommand {command!r}: gpuops does not read {arg!r}; {form}")
    if dest is None or values.get("-W") != "%h:%p":
        raise ConfigError(mark, f"ProxyCommand {command!r}: expected -W %h:%p and a host; {form}")
    spec = (f"{values['-l']}@" if "-l" in values and "@" not in dest else "") + dest
    if "-p" in values:
        spec += f":{values['-p']}"
    return spec, values.get("-i")
