"""A webhook on 127.0.0.1 for the notification tests: a real HTTP server on a free port that keeps what it was sent.

`Hook(answer=200)`: every POST is answered with that status; `answer=None`: the connection is accepted,
the request read, and no answer ever comes (until `close()`): the hook that hangs. `phrase`: the reason
phrase of the status line, as sent (a hostile one holds escapes). `redirect`: a 302 to that path, whose
GET is answered 200 (what a redirect followed with the method changed reaches). `trickle`: a 200 with
its headers, then one byte of body a second. `hold`: seconds to wait before answering a notification of
that `what`. `got` lists the bodies (JSON decoded), `paths` the request paths, `gets` the GETs' paths,
`auth` each request's Authorization header, `times` (what, arrived, answered) per POST; `open` counts
requests being held unanswered.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hook:
    def __init__(self, answer: int | None = 200, path: str = "/hook", *, phrase: str | None = None,
                 redirect: str | None = None, trickle: bool = False, hold: dict[str, float] | None = None) -> None:
        self.answer = answer
        self.got: list[Any] = []
        self.paths: list[str] = []
        self.gets: list[str] = []
        self.auth: list[str | None] = []
        self.times: list[tuple[Any, float, float]] = []
        self.open = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with hook.lock:
                    hook.gets.append(self.path)
                self._answer(200, None, b"ok")

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                arrived = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook.lock:
                    hook.paths.append(self.path)
                    hook.auth.append(self.headers.get("Authorization"))
                    try:
                        hook.got.append(json.loads(body))
                    except ValueError:
                        hook.got.append(body)
                    what = hook.got[-1].get("what") if isinstance(hook.got[-1], dict) else None
                if hook.answer is None:
                    with hook.lock:
                        hook.open += 1
                    hook.release.wait()
                    with hook.lock:
                        hook.open -= 1
                    return
                hook.release.wait((hold or {}).get(what, 0))
                if redirect is not None:
                    self.send_response(302)
                    self.send_header("Location", redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif trickle:
                    self.send_response(200)
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    try:
                        while not hook.release.wait(1.0):
                            self.wfile.write(b"x")
                            self.wfile.flush()
                    except OSError:  # the client gave up on it: what the trickle is for
                        return
                else:
                    self._answer(hook.answer, phrase, b"ok")
                with hook.lock:
                    hook.times.append((what, arrived, time.time()))

            def _answer(self, status: int, said: str | None, data: bytes) -> None:
                self.send_response(status, said)  # a phrase goes out as given, escapes and all
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def whats(self) -> list[str]:
        with self.lock:
            return [g.get("what") for g in self.got if isinstance(g, dict)]

    def of(self, what: str) -> list[dict[str, Any]]:
        with self.lock:
            return [g for g in self.got if isinstance(g, dict) and g.get("what") == what]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "Hook":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
