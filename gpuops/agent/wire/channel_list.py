"""The notification channel kinds, each declared once, as data both sides read.

A kind is one ChannelSpec in CHANNELS: its name (the key of a `notify:` entry that holds its address, as
`webhook: URL`; `kind` in watch.json; `via` in the notify_sent and notify_failed events), each of its keys
(type, default, choices, what is a secret: the playbook loader validates them from here, and docs/playbook.md
names them), how long one try may take, whether a try's output is kept, and the agent module that sends
through it (gpuops/agent/notify/<module>.py, class `Sender`, found by that name as an Ansible plugin is found
by its file). The config loader, watch.json (watchfile), the sender and its retries, `notify-test` and
the JSON schema all derive from this list: a new kind is its own module plus one entry here
(docs/architecture.md). A channel of a playbook or a run is a Channel: its kind named, its settings typed.
Standard library only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["CHANNELS", "Channel", "ChannelSpec", "Key", "MASK", "by_kind", "kinds", "longest_try"]

#: What a key's value is (the playbook loader's reader for it, gpuops/config/notify_keys.py): url (an http(s)
#: URL, written plain or as {value | from_env, secret}; a secret when the playbook says so, by default when it
#: comes from the environment, always when it carries `user:password@`), shell (a command bash runs on the
#: target: not empty, no NUL, at most 64 KiB), choice (one of `choices`), text (a non-empty string).
KINDS = ("url", "shell", "choice", "text")
#: How a secret value is shown.
MASK = "***"


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a channel kind (`notify[].<name>`)."""

    name: str
    kind: str
    default: Any = None
    doc: str = ""  # what it means (docs)
    what: str = ""  # how an error message names the value it expects ("a webhook URL")
    choices: Tuple[str, ...] = ()  # choice: what it may say
    secret: bool = False  # text: the value is a secret (a url's secrecy is the playbook's, see KINDS)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError("key %r: kind must be one of %s" % (self.name, ", ".join(KINDS)))


@dataclasses.dataclass(frozen=True)
class ChannelSpec:
    """One channel kind (see the module docstring)."""

    kind: str  # its name: the key of its address in a `notify:` entry; `kind` in watch.json, `via` in events
    module: str  # gpuops/agent/notify/<module>.py sends through it (class Sender)
    keys: Tuple[Key, ...]  # the first is its address (named as the kind, required); then its options
    doc: str = ""
    what: str = ""  # what its address is, as a message says ("a URL", "run on the target")
    gets: str = ""  # how it gets the payload, said when a key of another kind is written on it
    limit: float = 10.0  # seconds one try takes at most, whatever the channel does
    output: bool = False  # a try's output is kept in the run directory (notify/<key>-<n>.out; the events name it)

    settings: Any = dataclasses.field(init=False, repr=False, compare=False)  # the class of its settings

    def __post_init__(self) -> None:
        names = [k.name for k in self.keys]
        if not names or names[0] != self.kind or len(set(names)) != len(names) or "on" in names or "kind" in names:
            raise ValueError("channel kind %r: its address first, named as the kind; each key once; no `on`, `kind`"
                             % self.kind)
        if sum(k.kind == "url" for k in self.keys) > 1 or "secret" in names:
            raise ValueError("channel kind %r: one url key at most (its `secret` says whether it is one)" % self.kind)
        hidden = {k.name for k in self.keys if k.kind == "url" or k.secret}  # no repr shows a secret one
        fields: List[Any] = [(self.kind, Any, dataclasses.field(repr=self.kind not in hidden))]
        fields += [(k.name, Any, dataclasses.field(default=k.default, repr=k.name not in hidden))
                   for k in self.keys[1:]]
        if self.url_key is not None:
            fields.append(("secret", bool, dataclasses.field(default=False)))
        cls = dataclasses.make_dataclass(_camel(self.kind) + "Settings", fields, frozen=True)
        cls.__doc__ = "The settings of a %s channel (gpuops/agent/wire/channel_list.py)." % self.kind
        object.__setattr__(self, "settings", cls)

    @property
    def url_key(self) -> Optional[Key]:
        return next((k for k in self.keys if k.kind == "url"), None)

    def plain(self, settings: Any, shown: bool = False) -> Dict[str, Any]:
        """Its settings as watch.json carries them (`shown`: each secret value as ***)."""
        out = {k.name: getattr(settings, k.name) for k in self.keys}
        if self.url_key is not None:
            out["secret"] = bool(settings.secret)
        if shown:
            out.update({k.name: MASK for k in self.keys if self._secret(k, settings) and out[k.name]})
        return out

    def read(self, raw: Dict[str, Any]) -> Any:
        """Its settings from a record (watch.json's channel), what the record lacks from the keys' defaults."""
        given = {k.name: raw.get(k.name, k.default) for k in self.keys}
        if self.url_key is not None:
            given["secret"] = bool(raw.get("secret"))
        return self.settings(**given)

    def secrets(self, settings: Any) -> Tuple[str, ...]:
        """The values of its settings that must never be shown."""
        return tuple(str(getattr(settings, k.name)) for k in self.keys
                     if self._secret(k, settings) and getattr(settings, k.name))

    def shown(self, settings: Any) -> str:
        """The channel as gpuops may show it: its kind, and its URL (or *** for a secret one)."""
        url = self.url_key
        if url is None:
            return self.kind
        return "%s %s" % (self.kind, MASK if self._secret(url, settings) else getattr(settings, url.name))

    @staticmethod
    def _secret(key: Key, settings: Any) -> bool:
        return key.secret or (key.kind == "url" and bool(settings.secret))


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


@dataclasses.dataclass(frozen=True)
class Channel:
    """One `notify:` channel, typed: its kind, the events it is told of (`on`), its kind's settings (None: a
    kind this gpuops does not know, in a newer one's record: it fails with that reason)."""

    kind: str
    on: Tuple[str, ...]
    settings: Any = None

    @property
    def spec(self) -> Optional[ChannelSpec]:
        return by_kind(self.kind)

    def secrets(self) -> Tuple[str, ...]:
        spec = self.spec
        return () if spec is None or self.settings is None else spec.secrets(self.settings)

    @property
    def shown(self) -> str:
        """What this channel is, as gpuops may show it."""
        spec = self.spec
        return self.kind if spec is None or self.settings is None else spec.shown(self.settings)


#: The channel kinds. Their order is the order a message lists them in.
CHANNELS: Tuple[ChannelSpec, ...] = (
    ChannelSpec(
        "webhook", "webhook", what="a URL", limit=10.0,
        doc="an HTTP POST of the payload (urllib: the target's proxies apply), never redirected",
        keys=(
            Key("webhook", "url", doc="the URL: a string, or {value: URL} / {from_env: NAME}, with `secret`",
                what="a webhook URL"),
            Key("format", "choice", "json", "json: the payload; slack: {\"text\": ...}", choices=("json", "slack"),
                what="a webhook format (json: the payload; slack: {\"text\": ...})"),
        )),
    ChannelSpec(
        "command", "shellcmd", what="run on the target", limit=30.0, output=True,
        gets="a command gets the payload in the file $GPUOPS_NOTIFY_JSON",
        doc="a command bash runs on the target, in the playbook's workdir and env, with GPUOPS_NOTIFY_JSON and "
            "GPUOPS_NOTIFY_TEXT",
        keys=(
            Key("command", "shell", doc="the command (at most 64 KiB)", what="a command run on the target"),
        )),
)


def by_kind(kind: str) -> Optional[ChannelSpec]:
    return next((spec for spec in CHANNELS if spec.kind == kind), None)


def kinds() -> Tuple[str, ...]:
    """Every kind's name (`via` in the events)."""
    return tuple(spec.kind for spec in CHANNELS)


def longest_try() -> float:
    """The most seconds one try of any kind takes."""
    return max(spec.limit for spec in CHANNELS)
