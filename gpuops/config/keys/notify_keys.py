"""The playbook's `notify:` section: where the watchdog tells the operator what happened (docs/notify.md).

Each channel is read as its kind's entry in gpuops/agent/wire/channel_list.py declares it: the one key that
names its kind (its address), each of its keys by its type and choices, every bad value a ConfigError at its
FILE:LINE:COL. No kind is named here: a new one is read by its entry alone.
"""

from __future__ import annotations

import os
from typing import Any, Iterable
from typing import Mapping as Env

from gpuops.agent.wire.channel_list import CHANNELS, Channel, ChannelSpec, Key
from gpuops.agent.wire.hookurl import split_url
from gpuops.agent.wire.protocol import NOTIFY_DEFAULT_ON as DEFAULT_ON
from gpuops.agent.wire.protocol import NOTIFY_WHATS as WHATS
from gpuops.config import schema as s
from gpuops.config.yamlpos import Node, Scalar
from gpuops.errors import ConfigError
from gpuops.position import Mark

#: A channel's keys: `on`, then each kind's (its address first).
CHANNEL_KEYS = ("on",) + tuple(dict.fromkeys(k.name for spec in CHANNELS for k in spec.keys))
#: A URL written as a mapping (a `url` key: a webhook's).
WEBHOOK_KEYS = ("value", "from_env", "secret")
MAX_CHANNELS = 20
#: A notify command's size at most (UTF-8 bytes): Linux passes it to bash as one argument of at most 128 KiB
#: (MAX_ARG_STRLEN); half of that leaves room for the rest of what the command line carries.
MAX_COMMAND = 1 << 16


def parse_notify(node: Node | None, environ: Env[str, str] = os.environ, need_env: bool = True) -> tuple[Channel, ...]:
    """The channels, in order (none when the section is absent or null)."""
    if node is None or s.is_null(node):
        return ()
    kinds = _either([f"`{spec.kind}`" for spec in CHANNELS])
    channels = s.items(node, f"notification channels (each a mapping with {kinds})")
    if len(channels) > MAX_CHANNELS:
        raise ConfigError(channels[MAX_CHANNELS].mark, f"notify: at most {MAX_CHANNELS} channels")
    return tuple(_channel(item, i, environ, need_env) for i, item in enumerate(channels, 1))


def _either(names: Iterable[str]) -> str:
    """`a` or `b`; `a`, `b` or `c`."""
    listed = list(names)
    return listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " or " + listed[-1]


def _channel(node: Node, number: int, environ: Env[str, str], need_env: bool) -> Channel:
    """One channel: its kind is the one kind key it holds; its other keys are its kind's (read after `on`, its
    options before its address)."""
    where = f"notify channel {number}"
    sec = s.Section(node, where, CHANNEL_KEYS)
    given = [spec for spec in CHANNELS if sec.get(spec.kind) is not None]
    if len(given) != 1:
        two = len(CHANNELS) == 2
        kinds = _either([f"`{spec.kind}` ({spec.what})" for spec in CHANNELS])
        raise ConfigError(sec.key_mark(given[1].kind) if given else sec.mark,
                          f"{where} takes {kinds}, " + (("not both" if two else "only one of them") if given else
                                                         ("and has neither" if two else "and has none of them")))
    spec = given[0]
    on = _on(on_node, where) if (on_node := sec.get("on")) is not None else DEFAULT_ON
    _foreign(spec, sec, where)
    fields: dict[str, Any] = {}
    for key in spec.keys[1:] + spec.keys[:1]:
        if (value_node := sec.get(key.name)) is not None:
            fields.update(_value(key, value_node, where, environ, need_env))
    return Channel(spec.kind, on, spec.settings(**fields))


def _foreign(spec: ChannelSpec, sec: s.Section, where: str) -> None:
    """A key of another kind written on this one's channel."""
    own = {k.name for k in spec.keys}
    for other in CHANNELS:
        for key in other.keys[1:]:
            if key.name not in own and sec.get(key.name) is not None:
                raise ConfigError(sec.key_mark(key.name), f"{where}: `{key.name}` is for a {other.kind}"
                                                          + (f"; {spec.gets}" if spec.gets else ""))


def _value(key: Key, node: Node, where: str, environ: Env[str, str], need_env: bool) -> dict[str, Any]:
    """One key's value, read by its type (wire/channel_list.KINDS), as the settings' fields."""
    if key.kind == "url":
        url, secret, _source = secret_url(node, f"{where}'s {key.name}", environ, need_env, key.what or "a URL")
        return {key.name: url, "secret": secret}
    if key.kind == "shell":
        return {key.name: _command(node, where)}
    if key.kind == "choice":
        return {key.name: s.choice(node, key.choices, key.what or f"one of {', '.join(key.choices)}")}
    return {key.name: s.nonempty(node, key.what or "a string")}


def _command(node: Node, where: str) -> str:
    """A command the target can run: bash gets it as one argument, which Linux caps (MAX_ARG_STRLEN)."""
    command = s.nonempty(node, "a command run on the target")
    if "\x00" in command:
        raise ConfigError(node.mark, f"{where}: the command holds a NUL character, which no command can")
    size = len(command.encode("utf-8"))
    if size > MAX_COMMAND:
        raise ConfigError(node.mark, f"{where}: the command is {size} bytes, more than {MAX_COMMAND}: bash gets it as "
                                     "one argument, which Linux caps at 128 KiB; put it in a script on the target")
    return command


def _on(node: Node, where: str) -> tuple[str, ...]:
    out = s.distinct_names(node, f"events ({', '.join(WHATS)})", WHATS, f"{where}: on", "is no event")
    if not out:
        raise ConfigError(node.mark, f"{where}: on is empty; leave it out for the default ({', '.join(DEFAULT_ON)})")
    return out


def secret_url(node: Node, named: str, environ: Env[str, str], need_env: bool,
               noun: str = "a webhook URL") -> tuple[str, bool, str | None]:
    """(URL, secret, the local variable it was read from) of a URL written plain or as `{value | from_env,
    secret}` (a notify webhook, watch.metrics.pushgateway: `named` names it in messages). A URL with credentials
    (`user:password@`) is a secret whatever the playbook says: its password is never shown."""
    url, secret, source = _read_url(node, named, environ, need_env, noun)
    return url, secret or _has_credentials(url), source


def _has_credentials(url: str) -> bool:
    return "@" in url.split("://", 1)[-1].split("/", 1)[0].split("?", 1)[0]


def _read_url(node: Node, named: str, environ: Env[str, str], need_env: bool,
              noun: str) -> tuple[str, bool, str | None]:
    if isinstance(node, Scalar):
        return _url(s.nonempty(node, f"{noun} (http:// or https://)"), node.mark, named, shown=True), False, None
    sec = s.Section(node, named, WEBHOOK_KEYS)
    value_node, from_node = sec.get("value"), sec.get("from_env")
    if (value_node is None) == (from_node is None):
        raise ConfigError(sec.mark, f"{named} takes `value` (the URL) or `from_env` (the variable "
                                    "holding it), one of them")
    secret_node = sec.get("secret")
    if value_node is not None:
        secret = s.boolean(secret_node) if secret_node is not None else False
        url = _url(s.nonempty(value_node, noun), value_node.mark, named, shown=not secret)
        return url, secret, None
    assert from_node is not None  # one of the two, said above
    secret = s.boolean(secret_node) if secret_node is not None else True  # a URL kept in the environment is a credential
    source = from_node.text if isinstance(from_node, Scalar) and s.IDENTIFIER.match(from_node.text) else None
    if source is None:
        raise ConfigError(from_node.mark, f"expected an environment variable name, got {s.describe(from_node)}")
    if source not in environ:
        if not need_env:
            return "", secret, source
        raise ConfigError(from_node.mark, f"environment variable '{source}' is not set ({named} "
                                          "reads its URL from it)")
    return _url(environ[source], from_node.mark, named, shown=not secret, source=source), secret, source


def _url(url: str, mark: Mark, named: str, *, shown: bool, source: str | None = None) -> str:
    """An http(s) URL with a host the sender can POST to (wire/hookurl.split_url: a `user:password@` is sent as
    Basic authentication); the message never quotes a secret one."""
    try:
        if url.isprintable():
            split_url(url)
            return url
    except ValueError:  # a bad port, a bad IPv6 host ("http://[::1/x")
        pass
    what = f"environment variable '{source}'" if source else named
    got = f": got {url!r}" if shown and not _has_credentials(url) else " (its value is a secret: not shown)"
    raise ConfigError(mark, f"{what} is not an http:// or https:// URL with a host{got}")
