"""One delivery: a webhook POST (urllib) or a command on the target, each try bounded, retried with backoff.

Every answer says what came back in words a person reads; a secret URL never appears in them (urllib's
error texts may quote the URL: they are masked before anything keeps them).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Dict

from .. import SH

#: A webhook try waits this long for the answer at most (a hook that accepts and never answers costs no more).
POST_TIMEOUT = 10.0
#: A command channel's limit.
COMMAND_TIMEOUT = 30.0
#: Failed deliveries are tried again until this long after the notification was queued.
RETRY_FOR = 300.0
#: Seconds before the 1st, 2nd ... retry (then the last, again).
BACKOFF = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)
#: What the command's output file keeps at most.
OUTPUT_LIMIT = 1 << 16
#: HTTP answers that are worth another try (others in 4xx say the request itself is wrong).
RETRY_STATUS = (408, 425, 429)


def body(channel: Dict[str, Any], payload: Dict[str, Any]) -> bytes:
    """What is POSTed: the payload, or Slack's {"text": ...} (an incoming webhook takes only that)."""
    if channel.get("format") == "slack":
        return json.dumps({"text": payload["text"]}).encode()
    return json.dumps(payload, sort_keys=True).encode()


def post(url: str, data: bytes, mask: Callable[[str], str], timeout: float = POST_TIMEOUT) -> Dict[str, Any]:
    """One POST: {ok, status, reason, retry}."""
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "gpuops-notify"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the playbook's own http(s) URL
            resp.read(65536)
            return {"ok": True, "status": int(resp.status)}
    except urllib.error.HTTPError as exc:
        code = int(exc.code)
        return {"ok": False, "status": code, "reason": mask("HTTP %d %s" % (code, exc.reason)),
                "retry": code >= 500 or code in RETRY_STATUS}
    except urllib.error.URLError as exc:
        return {"ok": False, "reason": mask("cannot reach the hook: %s" % (exc.reason,)), "retry": True}
    except (OSError, ValueError, http.client.HTTPException) as exc:  # timeouts, resets mid-answer, a garbled answer
        why = "no answer within %gs" % timeout if isinstance(exc, TimeoutError) or "timed out" in str(exc) else \
            "%s: %s" % (type(exc).__name__, exc)
        return {"ok": False, "reason": mask(why), "retry": True}


def run_command(command: str, folder: str, payload_file: str, text: str, output: str,
                timeout: float = COMMAND_TIMEOUT) -> Dict[str, Any]:
    """The command, in the run's workdir and env (sh/notify.sh), its output kept in `output`: {ok, exit, reason}."""
    env = dict(os.environ, GPUOPS_NOTIFY_JSON=payload_file, GPUOPS_NOTIFY_TEXT=text)
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(["bash", os.path.join(SH, "notify.sh"), folder, command], stdin=subprocess.DEVNULL,
                                stdout=fd, stderr=fd, env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        return {"ok": False, "reason": "cannot run bash: %s" % (exc.strerror or exc), "retry": False}
    finally:
        os.close(fd)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        return {"ok": False, "reason": "the command did not end within %gs (killed)" % timeout, "retry": True}
    if code == 0:
        return {"ok": True, "exit": 0}
    return {"ok": False, "exit": code, "reason": "the command exited with code %d (its output: %s)" % (code, output),
            "retry": True}


def tail(path: str, limit: int = 2000) -> str:
    """The last characters of a command's output."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def once(channel: Dict[str, Any], payload: Dict[str, Any], *, folder: str, payload_file: str, output: str,
         mask: Callable[[str], str]) -> Dict[str, Any]:
    """One try through the channel."""
    if channel.get("command"):
        return run_command(str(channel["command"]), folder, payload_file, payload["text"], output)
    return post(str(channel.get("webhook") or ""), body(channel, payload), mask)


def with_retries(channel: Dict[str, Any], payload: Dict[str, Any], *, since: float, folder: str, payload_file: str,
                 output: str, mask: Callable[[str], str], retry_for: float = RETRY_FOR,
                 sleep: Callable[[float], None] = time.sleep) -> Dict[str, Any]:
    """Tries until one succeeds, one fails for good, or `retry_for` seconds since the notification passed:
    the last answer, with `tries` and `seconds`."""
    tries = 0
    while True:
        tries += 1
        answer = once(channel, payload, folder=folder, payload_file=payload_file, output=output, mask=mask)
        answer.update(tries=tries, seconds=round(time.time() - since, 3))
        wait = BACKOFF[min(tries - 1, len(BACKOFF) - 1)]
        if answer["ok"] or not answer.get("retry") or time.time() + wait > since + retry_for:
            answer.pop("retry", None)
            if not answer["ok"] and tries > 1:
                answer["reason"] = "%s (tried %d times over %.0fs)" % (answer["reason"], tries, time.time() - since)
            return answer
        sleep(wait)


def channel_kind(channel: Dict[str, Any]) -> str:
    return "command" if channel.get("command") else "webhook"
