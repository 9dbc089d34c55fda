"""One delivery: a webhook POST (webhook.py) or a command on the target, each try bounded, retried with backoff.

Every answer says what came back in words a person reads; a secret URL never appears in them (they are
built from gpuops' own words, and masked before anything keeps them), and what a hook or a command said
has its control characters escaped. Whatever goes wrong inside a try is that try's answer: a channel
never fails without a recorded reason.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Optional, Set

from .. import SH
from .said import clean, clean_lines
from .webhook import RETRY_STATUS, TRY_LIMIT, post  # noqa: F401 - the webhook's bounds, named here too

#: A webhook try ends this long after it began at most (kept under its old name for callers).
POST_TIMEOUT = TRY_LIMIT
#: A command channel's limit.
COMMAND_TIMEOUT = 30.0
#: Failed deliveries are tried again until this long after the notification was queued.
RETRY_FOR = 300.0
#: Seconds before the 1st, 2nd ... retry (then the last, again).
BACKOFF = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
#: What a command's output file keeps: its last bytes, over all its tries (the rest is read and dropped).
OUTPUT_LIMIT = 1 << 16
#: How long the output of a command that ended is read on: a child it left behind may hold its pipe.
OUTPUT_DRAIN = 2.0

#: Process groups of the notify commands running now (notify-test ends them when its client is gone).
RUNNING: Set[int] = set()
_running_lock = threading.Lock()


def slack_text(text: str) -> str:
    """A line for Slack: `&`, `<` and `>` escaped as Slack asks senders to, so a log line's `<!channel>` or
    `<url|label>` is shown as written, never acted on."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def body(channel: Dict[str, Any], payload: Dict[str, Any]) -> bytes:
    """What is POSTed: the payload, or Slack's {"text": ...} (an incoming webhook takes only that)."""
    if channel.get("format") == "slack":
        return json.dumps({"text": slack_text(str(payload["text"]))}).encode()
    return json.dumps(payload, sort_keys=True).encode()


def run_command(command: str, folder: str, payload_file: str, text: str, output: str,
                timeout: float = COMMAND_TIMEOUT) -> Dict[str, Any]:
    """The command, in the run's workdir and env (sh/notify.sh), the tail of its output kept in `output`:
    {ok, exit, reason}."""
    # An environment value cannot hold NUL (exec refuses it): a NUL of the matched line is shown as \x00.
    env = dict(os.environ, GPUOPS_NOTIFY_JSON=payload_file, GPUOPS_NOTIFY_TEXT=text.replace("\x00", "\\x00"))
    rfd, wfd = os.pipe()
    try:
        proc = subprocess.Popen(["bash", os.path.join(SH, "notify.sh"), folder, command], stdin=subprocess.DEVNULL,
                                stdout=wfd, stderr=wfd, env=env, start_new_session=True, close_fds=True)
    except (OSError, ValueError) as exc:
        os.close(rfd)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return {"ok": False, "reason": "cannot run the command: %s" % why, "retry": False}
    finally:
        os.close(wfd)
    with _running_lock:
        RUNNING.add(proc.pid)
    kept = _Tail(rfd)
    try:
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            code = None
    finally:
        with _running_lock:
            RUNNING.discard(proc.pid)
        kept.finish(output)
    if code is None:
        return {"ok": False, "reason": "the command did not end within %gs (killed)" % timeout, "retry": True}
    if code == 0:
        return {"ok": True, "exit": 0}
    return {"ok": False, "exit": code, "reason": "the command exited with code %d (its output: %s)" % (code, output),
            "retry": True}


class _Tail:
    """Reads a command's output as it comes and keeps its last OUTPUT_LIMIT bytes."""

    def __init__(self, fd: int) -> None:
        self.fd, self.data, self.stop = fd, bytearray(), threading.Event()
        self.thread = threading.Thread(target=self._read, name="gpuops-notify-output", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if not ready:
                    if self.stop.is_set():
                        return
                    continue
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    return
                self.data += chunk
                if len(self.data) > 2 * OUTPUT_LIMIT:
                    del self.data[:-OUTPUT_LIMIT]
        finally:
            os.close(self.fd)

    def finish(self, output: str) -> None:
        """The command ended: read what is left (for a moment), then keep the tail with the tries' before."""
        self.thread.join(OUTPUT_DRAIN)
        self.stop.set()
        self.thread.join()
        try:
            with open(output, "rb") as fh:
                before = fh.read()[-OUTPUT_LIMIT:]
        except OSError:
            before = b""
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (before + bytes(self.data))[-OUTPUT_LIMIT:])
        finally:
            os.close(fd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def kill_running() -> None:
    """End every notify command running now (its whole process group)."""
    with _running_lock:
        pids = list(RUNNING)
    for pid in pids:
        _kill_group(pid)


def tail(path: str, limit: int = 2000) -> str:
    """The last characters of a command's output, control characters escaped."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
            return clean_lines(fh.read().decode("utf-8", "replace"))
    except OSError:
        return ""


def once(channel: Dict[str, Any], payload: Dict[str, Any], *, folder: str, payload_file: str, output: str,
         mask: Callable[[str], str], limit: Optional[float] = None) -> Dict[str, Any]:
    """One try through the channel, within `limit` seconds (default: the channel's own); never raises."""
    try:
        if channel.get("command"):
            answer = run_command(str(channel["command"]), folder, payload_file, str(payload["text"]), output,
                                 timeout=min(COMMAND_TIMEOUT, limit or COMMAND_TIMEOUT))
        else:
            answer = post(str(channel.get("webhook") or ""), body(channel, payload), mask,
                          timeout=min(TRY_LIMIT, limit or TRY_LIMIT))
    except Exception as exc:  # noqa: BLE001 - a channel's every failure is a recorded one
        answer = {"ok": False, "reason": "the channel failed: %s" % type(exc).__name__, "retry": True}
    if "reason" in answer:
        answer["reason"] = clean(mask(str(answer["reason"])))
    return answer


def with_retries(channel: Dict[str, Any], payload: Dict[str, Any], *, since: float, folder: str, payload_file: str,
                 output: str, mask: Callable[[str], str], retry_for: float = RETRY_FOR,
                 sleep: Callable[[float], None] = time.sleep, event_ts: Optional[float] = None) -> Dict[str, Any]:
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


def channel_kind(channel: Dict[str, Any]) -> str:
    return "command" if channel.get("command") else "webhook"
