"""A webhook on 127.0.0.1 for the notification tests: a real HTTP server on a free port that keeps what it was sent.

`Hook(answer=200)`: every POST is answered with that status; `answer=None`: the connection is accepted,
the request read, and no answer ever comes (until `close()`): the hook that hangs. `got` lists the
bodies (JSON decoded), `paths` the request paths, `open` counts requests being held unanswered.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hook:
    def __init__(self, answer: int | None = 200, path: str = "/hook") -> None:
        self.answer = answer
        self.got: list[Any] = []
        self.paths: list[str] = []
        self.open = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with hook.lock:
                    hook.paths.append(self.path)
                    try:
                        hook.got.append(json.loads(body))
                    except ValueError:
                        hook.got.append(body)
                if hook.answer is None:
                    with hook.lock:
                        hook.open += 1
                    hook.release.wait()
                    with hook.lock:
                        hook.open -= 1
                    return
                self.send_response(hook.answer)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
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
