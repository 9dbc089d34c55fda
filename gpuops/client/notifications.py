"""`gpuops notify-test`: one test payload through every `notify:` channel, sent from the target (its network
and env are what the watchdog's notifications will use), and what each channel answered."""

from __future__ import annotations

import json
import secrets
from typing import Any, Iterator

from gpuops.agent.wire.channel_list import longest_try
from gpuops.agent.wire.protocol import NOTIFY_TEST as TEST
from gpuops.client.events import Event, Outcome
from gpuops.client.play import Play
from gpuops.client.runspec import env_script, notify_config, workdir
from gpuops.errors import ExitCode, UsageError

#: The target tool tries every channel at once: the longest try of any kind (a command's 30 s), plus a start on
#: a loaded target.
TOOL_TIMEOUT = longest_try() + 30.0


def test_spec(play: Play, run: str) -> bytes:
    """What the target's notify-test reads on stdin (secret URLs and env values included: it is not shown); the
    test payload is built there, from the run, target and playbook named here."""
    pb = play.playbook
    return json.dumps({
        "channels": notify_config(play),
        "run": run,
        "target": play.target.name,
        "playbook": pb.name,
        "env": env_script(play).render() + "\n",
        "workdir": workdir(play),
        "secrets": list(pb.secrets),
    }).encode()


def notify_test(play: Play) -> Iterator[Event | Outcome]:
    """Each channel's answer as a notify_sent / notify_failed event, then the outcome (exit 9 if any failed)."""
    pb = play.playbook
    if not pb.notify:
        raise UsageError(f"{pb.path}: the playbook has no notify: channels to test", hint="see docs/notify.md")
    run = "notify-test-" + secrets.token_hex(3)
    answers = play.door.notify_test(test_spec(play, run), timeout=TOOL_TIMEOUT)
    failed = []
    for i, channel in enumerate(pb.notify, 1):
        answer = next((a for a in answers if a.get("channel") == i), None)
        if answer is None:
            answer = {"ok": False, "channel": i, "via": channel.kind,
                      "reason": "the target's notify-test said nothing of this channel"}
        fields: dict[str, Any] = {k: answer[k] for k in ("channel", "via", "status", "exit", "reason", "seconds", "output")
                                  if k in answer}
        ok = bool(answer.get("ok"))
        if not ok:
            failed.append(i)
        yield Event("notify_sent" if ok else "notify_failed", play.target.name, None, {"what": TEST, **fields})
    total = len(pb.notify)
    if failed:
        which = ", ".join(map(str, failed))
        yield Outcome("notify-failed", ExitCode.NOTIFY_FAILED,
                      f"{len(failed)} of {total} notification channel(s) failed (channel {which}), sent from "
                      f"{play.target.name}")
        return
    yield Outcome("notified", ExitCode.OK, f"every notification channel ({total}) took the test payload, sent from "
                                          f"{play.target.name}")
