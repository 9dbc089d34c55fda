"""A webhook URL as the sender posts to it: the one reading of it, so the playbook loader refuses at its line
what the agent's sender (agent/notify/webhook.py) could not post to. Standard library only."""

from __future__ import annotations

import base64
from typing import Optional, Tuple
from urllib.parse import quote, unquote, urlsplit, urlunsplit

#: What a path or query may hold unquoted; the rest (a space, non-ASCII) is percent-encoded as browsers do.
_URL_SAFE = "/%:@!$&'()*+,;=-._~?"


def split_url(url: str) -> Tuple[str, Optional[str]]:
    """The URL to POST to (no userinfo; a space or non-ASCII character percent-encoded) and its Basic
    authorization header (from `user:password@`), or ValueError when it is no http(s) URL with a host."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host")
    parts.port  # noqa: B018 - raises ValueError on a bad port
    userinfo, at, hostport = parts.netloc.rpartition("@")
    auth = None
    if at:
        user, _, password = userinfo.partition(":")
        auth = "Basic " + base64.b64encode(("%s:%s" % (unquote(user), unquote(password))).encode("utf-8")).decode()
    path, query = quote(parts.path, safe=_URL_SAFE), quote(parts.query, safe=_URL_SAFE)
    return urlunsplit((parts.scheme, hostport, path, query, "")), auth
