"""The `notify` tool (deliver one queued notification of a run, every channel at once) and `notify-test`.

`python3 -m gpuops_agent notify RUN_ID KEY` is started detached by the watchdog (outbox.spawn); it holds
the notification's lock while it works, so a second sender of the same key does nothing, and skips the
channels notify.jsonl already has an answer of. Each channel's answer is appended to notify.jsonl and
is an event of the run (`notify_sent`, `notify_failed`) that `logs -f` and `launch` show.
`python3 -m gpuops_agent notify-test` reads {channels, run, target, playbook, env, workdir, secrets} on stdin,
builds the test payload (payload.test_payload), tries each channel once and prints one `notified` marker per
channel.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

from ..run.prepare import append_event
from ..wire import marks, watchfile
from ..wire import protocol as p
from ..wire.channel_list import Channel, longest_try
from ..wire.masking import Masker
from ..wire.records import read_json
from . import deliver, outbox
from .payload import test_payload

#: How long a notification waits for the one queued before it on the same channel: that one's retries
#: (5 minutes), its last try (the longest any kind takes), and a margin.
TURN_WAIT = deliver.RETRY_FOR + longest_try() + 10.0


def _answered(d: str, key: str) -> Dict[int, str]:
    """Channel -> sent/failed, as notify.jsonl says for this key."""
    return {int(r["channel"]): r["state"] for r in outbox.records(d)
            if r["key"] == key and r.get("state") in (outbox.SENT, outbox.FAILED) and isinstance(r.get("channel"), int)}


def report(d: str, key: str, what: str, number: int, channel: Channel, answer: Dict[str, Any]) -> None:
    """The channel's answer, in notify.jsonl and as an event of the run (`via`: the channel's kind)."""
    fields: Dict[str, Any] = {k: answer[k] for k in ("status", "exit", "tries", "seconds", "reason") if k in answer}
    if _keeps_output(channel):
        fields["output"] = outbox.output_file(d, key, number)
    outbox.append(d, {"key": key, "channel": number, "via": channel.kind,
                      "state": outbox.SENT if answer["ok"] else outbox.FAILED, **fields})
    append_event(d, "notify_sent" if answer["ok"] else "notify_failed", what=what, channel=number, via=channel.kind,
                 **fields)


def _keeps_output(channel: Channel) -> bool:
    spec = channel.spec
    return spec is not None and spec.output


def _waiting_on(d: str, key: str, number: int) -> bool:
    """An earlier notification that channel `number` carries has no answer there yet (its sender may still
    be starting: it was queued a moment ago, or works)."""
    recs = outbox.records(d)
    answered = {r["key"] for r in recs if r.get("state") == outbox.DONE or (
        r.get("state") in (outbox.SENT, outbox.FAILED) and r.get("channel") == number)}
    for rec in recs:
        if rec.get("state") != outbox.QUEUED:
            continue
        if rec["key"] == key:
            return False
        if number in (rec.get("channels") or []) and rec["key"] not in answered:
            return True
    return False


def wait_turn(d: str, key: str, number: int, bound: float = TURN_WAIT, poll: float = 0.2) -> bool:
    """Per channel, notifications go out in the order they were queued (a `stalled` never after its
    `aborted`): wait while an earlier one has no answer on this channel, `bound` seconds at most (its sender
    died). True when it waited."""
    deadline = time.time() + bound
    waited = False
    while time.time() < deadline and _waiting_on(d, key, number):
        waited = True
        time.sleep(poll)
    return waited


def tool_notify(argv: List[str]) -> int:
    run_id, key = argv
    d = p.run_dir(run_id)
    cfg = watchfile.read_or_default(d)
    channels = list(cfg.notify)
    queued = next((r for r in outbox.records(d) if r["key"] == key and r.get("state") == outbox.QUEUED), None)
    payload = read_json(outbox.payload_file(d, key))
    if queued is None or payload is None:
        sys.stderr.write("notify: nothing queued as %s in %s\n" % (key, d))
        return 2
    lock = open(outbox.lock_file(d, key), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another sender has it
    masker = Masker(list(cfg.secrets))
    queued_at = float(queued.get("ts") or time.time())
    done = _answered(d, key)
    workers = []
    for number in queued.get("channels") or []:
        if number in done or not 1 <= number <= len(channels):
            continue
        channel = channels[number - 1]

        def one(number: int = number, channel: Channel = channel) -> None:
            try:
                waited = wait_turn(d, key, number)
                answer = deliver.with_retries(channel, payload, since=max(queued_at, time.time()) if waited else
                                              queued_at, event_ts=queued_at, folder=d,
                                              payload_file=outbox.payload_file(d, key),
                                              output=outbox.output_file(d, key, number), mask=masker)
            except Exception as exc:  # noqa: BLE001 - a channel's every failure is a recorded one
                answer = {"ok": False, "reason": "the channel failed: %s" % type(exc).__name__}
            report(d, key, str(queued.get("what")), number, channel, answer)

        workers.append(threading.Thread(target=one, name="gpuops-notify-%d" % number))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    outbox.append(d, {"key": key, "state": outbox.DONE})
    return 0


def tool_notify_test(argv: List[str]) -> int:
    """Each channel tried once, from here (the target's network and env), its answer printed as a marker."""
    spec = json.loads(sys.stdin.buffer.readline().decode("utf-8"))  # one line: stdin stays open after it
    channels = [watchfile.channel(c) for c in spec.get("channels") or ()]
    payload = test_payload(str(spec["run"]), str(spec["target"]), str(spec["playbook"]))
    masker = Masker(spec.get("secrets") or [])
    work = tempfile.mkdtemp(prefix="gpuops-notify-test-")
    threading.Thread(target=_end_with_client, args=(work,), name="gpuops-notify-test-client", daemon=True).start()
    try:
        for name, text in (("env.sh", spec.get("env") or ""), (p.WORKDIR, spec.get("workdir") or "")):
            fd = os.open(os.path.join(work, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
        payload_file = os.path.join(work, "payload.json")
        with open(payload_file, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(payload, sort_keys=True) + "\n")
        answers: List[Dict[str, Any]] = [{} for _ in channels]

        def one(i: int) -> None:
            started = time.time()
            output = os.path.join(work, "%d.out" % (i + 1))
            answer = deliver.once(channels[i], payload, folder=work, payload_file=payload_file, output=output,
                                  mask=masker)
            answer.pop("retry", None)
            answer.update(channel=i + 1, via=channels[i].kind, seconds=round(time.time() - started, 3))
            if _keeps_output(channels[i]):
                answer["output"] = masker(deliver.tail(output))
            answers[i] = answer

        workers = [threading.Thread(target=one, args=(i,)) for i in range(len(channels))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for answer in answers:
        print(marks.mark("notified", json.dumps(answer, sort_keys=True)))
    return 0


def _end_with_client(work: str) -> None:
    """gpuops holds notify-test's stdin open while it waits for the answers: its end (gpuops killed, its
    connection gone) ends notify-test here, its commands with it, rather than trying channels for nobody."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    deliver.kill_running()
    shutil.rmtree(work, ignore_errors=True)
    os._exit(3)
