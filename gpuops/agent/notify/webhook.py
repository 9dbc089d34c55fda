"""The `webhook` channel kind: one try is an HTTP POST through urllib (the target's proxies apply), bounded in
all, never redirected, of the payload (`format: json`) or of Slack's {"text": ...} (`format: slack`). Its entry
is in gpuops/agent/wire/channel_list.py.

What a try answers is built from gpuops' own words, an errno's text and what the hook said (its status and
reason phrase, control characters escaped), never from an exception's text: urllib and http.client quote
the URL, or parts of it, in theirs. A URL's `user:password@` is sent as HTTP Basic authentication.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List

try:
    import ssl
except ImportError:  # a Python built without it: http hooks only
    ssl = None  # type: ignore[assignment]

from ..wire.hookurl import split_url
from . import deliver
from .said import clean

#: A try ends this long after it began at most, whatever the hook does (a hook that answers one byte a
#: second, a connection that never answers): each read waits no longer either.
TRY_LIMIT = 10.0
#: What is read of an answer's body at most (the answer is only looked at for its status).
ANSWER_LIMIT = 1 << 16
#: HTTP answers that are worth another try (others in 4xx say the request itself is wrong).
RETRY_STATUS = (408, 425, 429)

Answer = Dict[str, Any]


class _Sockets:
    """The sockets one try opened: closed from outside when the try runs out of time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.socks: List[socket.socket] = []

    def add(self, sock: socket.socket) -> socket.socket:
        with self.lock:
            self.socks.append(sock)
        return sock

    def shut(self) -> None:
        with self.lock:
            socks = list(self.socks)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _registering(base: Any, socks: _Sockets) -> Any:
    class Connection(base):  # type: ignore[misc, valid-type]
        _create_connection: Callable[..., socket.socket]  # http.client's, typed (the base is http's, given)

        def connect(self) -> None:
            create = self._create_connection
            self._create_connection = lambda *a, **k: socks.add(create(*a, **k))
            super().connect()
            socks.add(self.sock)

    return Connection


class _Http(urllib.request.HTTPHandler):
    def __init__(self, socks: _Sockets) -> None:
        super().__init__()
        self.socks = socks

    def http_open(self, req: Any) -> Any:
        return self.do_open(_registering(http.client.HTTPConnection, self.socks), req)


class _Https(getattr(urllib.request, "HTTPSHandler", urllib.request.BaseHandler)):  # type: ignore[misc]
    """(A Python built without ssl has no HTTPSHandler: it is left out, and an https URL cannot be reached.)"""

    def __init__(self, socks: _Sockets) -> None:
        super().__init__()
        self.socks = socks

    def https_open(self, req: Any) -> Any:
        return self.do_open(_registering(http.client.HTTPSConnection, self.socks), req, context=self._context)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx answer is the answer: following it turns the POST into a GET (301, 302, 303) or sends the
    payload where the hook chose."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def post(url: str, data: bytes | None, mask: Callable[[str], str], timeout: float = TRY_LIMIT, *,
         method: str = "POST", content_type: str = "application/json") -> Answer:
    """One POST (or the `method` given: the metrics' Pushgateway PUTs and DELETEs through the same door), over
    within `timeout` seconds whatever the hook does: {ok, status, reason, retry}."""
    try:
        target, auth = split_url(url)
    except ValueError:
        return {"ok": False, "reason": "the webhook URL is not an http(s) URL gpuops can send to", "retry": False}
    headers = {"Content-Type": content_type, "User-Agent": "gpuops-notify"}
    if auth:
        headers["Authorization"] = auth
    socks = _Sockets()
    seen: Dict[str, int] = {}
    box: List[Answer] = []
    worker = threading.Thread(target=lambda: box.append(_try(target, data, headers, socks, seen, timeout, method)),
                              name="gpuops-webhook", daemon=True)
    worker.start()
    worker.join(timeout)
    if not box:  # out of time: the worker is freed (a name lookup it may be in ends by itself) and left
        socks.shut()
        if "status" in seen:
            answer = {"ok": False, "status": seen["status"], "retry": True, "reason": _trickled(seen["status"], timeout)}
        else:
            answer = {"ok": False, "retry": True, "reason": "no answer within %gs" % timeout}
    else:
        answer = box[0]
    if "reason" in answer:
        answer["reason"] = clean(mask(str(answer["reason"])))
    return answer


def _trickled(status: int, timeout: float) -> str:
    return "HTTP %d but the answer did not end within %gs (the hook trickled it)" % (status, timeout)


def _try(url: str, data: bytes | None, headers: Dict[str, str], socks: _Sockets, seen: Dict[str, int],
         timeout: float, method: str = "POST") -> Answer:
    """The request and its answer (the caller's clock ends it; each read's own timeout is a backstop)."""
    handlers = [_Http(socks), _NoRedirect()] + ([_Https(socks)] if ssl is not None else [])
    opener = urllib.request.build_opener(*handlers)
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with opener.open(req, timeout=timeout + 1.0) as resp:
            seen["status"] = int(resp.status)
            resp.read(ANSWER_LIMIT)
            return {"ok": True, "status": seen["status"]}
    except urllib.error.HTTPError as exc:
        return _refused(int(exc.code), exc.reason)
    except urllib.error.URLError as exc:
        return {"ok": False, "reason": "cannot reach the hook: " + _why(exc.reason), "retry": True}
    except Exception as exc:  # noqa: BLE001 - every failure of a try is an answer, in words that quote no URL
        if "status" in seen:
            return {"ok": False, "status": seen["status"], "retry": True,
                    "reason": "HTTP %d but the answer broke off: %s" % (seen["status"], _why(exc))}
        return {"ok": False, "reason": _why(exc), "retry": True}


def _refused(code: int, phrase: Any) -> Answer:
    """An HTTP error answer: its status and the hook's own reason phrase (escaped); whether to try again."""
    said = clean(str(phrase or ""))[:200]
    head = "HTTP %d%s" % (code, " " + said if said else "")
    if 300 <= code < 400:
        return {"ok": False, "status": code, "retry": False,
                "reason": head + ": the hook redirects; gpuops never follows a redirect with a POST "
                                 "(set the URL it points to)"}
    return {"ok": False, "status": code, "reason": head, "retry": code >= 500 or code in RETRY_STATUS}


def _why(exc: Any) -> str:
    """An exception in words that quote no URL: an errno's text, a TLS verdict, else its kind."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no answer in time"
    if isinstance(exc, socket.gaierror):
        return "cannot resolve the hook's host (%s)" % (exc.strerror or "name lookup failed")
    if ssl is not None and isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS: the hook's certificate was refused (%s)" % (exc.verify_message or exc.reason or "not verified")
    if ssl is not None and isinstance(exc, ssl.SSLError):
        return "TLS: %s" % (exc.reason or "handshake failed")
    if isinstance(exc, OSError) and exc.errno:
        return "[Errno %d] %s" % (exc.errno, exc.strerror or "")
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the hook closed the connection without an answer"
    if isinstance(exc, http.client.BadStatusLine):
        return "the hook's answer is not HTTP"
    if isinstance(exc, (http.client.InvalidURL, ValueError)):
        return "the webhook URL cannot be sent (%s)" % type(exc).__name__
    if isinstance(exc, str):  # URLError's reason may be a plain word ("unknown url type" quotes the URL: not shown)
        return "the request could not be made"
    return type(exc).__name__


class Sender(deliver.Sender):
    """One try: the POST, its HTTP status the answer (a 5xx, 408, 425, 429 or no answer: tried again)."""

    def send(self, payload: Dict[str, Any], attempt: deliver.Try) -> Answer:
        return post(str(self.settings.webhook or ""), body(self.settings.format, payload), attempt.mask,
                    timeout=attempt.limit)


def slack_text(text: str) -> str:
    """A line for Slack: `&`, `<` and `>` escaped as Slack asks senders to, so a log line's `<!channel>` or
    `<url|label>` is shown as written, never acted on."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def body(fmt: str, payload: Dict[str, Any]) -> bytes:
    """What is POSTed: the payload, or Slack's {"text": ...} (an incoming webhook takes only that)."""
    if fmt == "slack":
        return json.dumps({"text": slack_text(str(payload["text"]))}).encode()
    return json.dumps(payload, sort_keys=True).encode()
