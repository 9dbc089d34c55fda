"""One delivery through a channel: its kind's Sender (found by name), each try bounded, retried with backoff.

A channel kind's sender is `class Sender(deliver.Sender)` in gpuops/agent/notify/<module>.py, the module its
entry in gpuops/agent/wire/channel_list.py names (webhook.py, shellcmd.py): it makes one try. What is the
same for every kind is here: the try's bound (the kind's `limit`), the retries and their backoff, the output
file a try may keep, and that whatever goes wrong inside a try is that try's answer, masked: a channel never
fails without a recorded reason, and a secret never appears in one.
"""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ..wire.channel_list import CHANNELS, Channel, ChannelSpec
from .said import clean, clean_lines

#: Failed deliveries are tried again until this long after the notification was queued.
RETRY_FOR = 300.0
#: Seconds before the 1st, 2nd ... retry (then the last, again).
BACKOFF = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
#: What a try's output file keeps: its last bytes, over all the tries (the rest is read and dropped).
OUTPUT_LIMIT = 1 << 16

Answer = Dict[str, Any]


@dataclass(frozen=True)
class Try:
    """What one try has: the folder it runs in (the run directory, or notify-test's), the file holding the
    payload, the file its output is kept in (a kind with `output`), the masker, and its seconds at most."""

    folder: str
    payload_file: str
    output: str
    mask: Callable[[str], str]
    limit: float


class Sender:
    """What every channel kind's sender is. `send` makes one try within `attempt.limit` seconds and answers
    {ok, reason (when not ok), retry (whether another try may help)}, with `status` (an HTTP answer) or `exit`
    (a command's) where it has one; an exception it raises is the try's answer too."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def send(self, payload: Dict[str, Any], attempt: Try) -> Answer:
        raise NotImplementedError

    @classmethod
    def end_all(cls) -> None:
        """End what its tries still run (notify-test's client is gone): nothing, unless a kind says."""


class _Unknown(Sender):
    """A kind this gpuops does not know (a newer one's record): every try fails, saying so."""

    def __init__(self, kind: str) -> None:
        super().__init__(None)
        self.kind = kind

    def send(self, payload: Dict[str, Any], attempt: Try) -> Answer:
        return {"ok": False, "reason": "this gpuops knows no channel kind %r" % self.kind, "retry": False}


def sender_class(spec: ChannelSpec) -> Any:
    """The class that sends through a kind: `Sender` of gpuops/agent/notify/<spec.module>.py."""
    return importlib.import_module("." + spec.module, __package__).Sender


def sender_of(channel: Channel) -> Sender:
    spec = channel.spec
    if spec is None or channel.settings is None:
        return _Unknown(channel.kind)
    sender: Sender = sender_class(spec)(channel.settings)
    return sender


def limit_of(channel: Channel) -> float:
    spec = channel.spec
    return spec.limit if spec is not None else 1.0


def kill_running() -> None:
    """End what every kind's tries still run (a notify command's whole process group)."""
    for spec in CHANNELS:
        sender_class(spec).end_all()


def tail(path: str, limit: int = 2000) -> str:
    """The last characters of a try's output file, control characters escaped."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
            return clean_lines(fh.read().decode("utf-8", "replace"))
    except OSError:
        return ""


def once(channel: Channel, payload: Dict[str, Any], *, folder: str, payload_file: str, output: str,
         mask: Callable[[str], str], limit: Optional[float] = None) -> Answer:
    """One try through the channel, within `limit` seconds (default: its kind's own); never raises."""
    bound = min(limit_of(channel), limit or limit_of(channel))
    try:
        answer = sender_of(channel).send(payload, Try(folder, payload_file, output, mask, bound))
    except Exception as exc:  # noqa: BLE001 - a channel's every failure is a recorded one
        answer = {"ok": False, "reason": "the channel failed: %s" % type(exc).__name__, "retry": True}
    if "reason" in answer:
        answer["reason"] = clean(mask(str(answer["reason"])))
    return answer


def with_retries(channel: Channel, payload: Dict[str, Any], *, since: float, folder: str, payload_file: str,
                 output: str, mask: Callable[[str], str], retry_for: float = RETRY_FOR,
                 sleep: Callable[[float], None] = time.sleep, event_ts: Optional[float] = None) -> Answer:
    """Tries until one succeeds, one fails for good, or `retry_for` seconds since `since` passed (no try
    runs past it): the last answer, with `tries` and `seconds` (since the event, `event_ts`)."""
    tries = 0
    end = since + retry_for
    while True:
        tries += 1
        answer = once(channel, payload, folder=folder, payload_file=payload_file, output=output, mask=mask,
                      limit=max(1.0, end - time.time()))
        answer.update(tries=tries, seconds=round(time.time() - (event_ts or since), 3))
        wait = BACKOFF[min(tries - 1, len(BACKOFF) - 1)]
        if answer["ok"] or not answer.get("retry") or time.time() + wait >= end:
            answer.pop("retry", None)
            if not answer["ok"] and tries > 1:
                answer["reason"] = "%s (tried %d times over %.0fs)" % (answer["reason"], tries, time.time() - since)
            return answer
        sleep(wait)
