"""Secrets out of everything gpuops says: the one place text is masked, always before it is shortened."""

from __future__ import annotations

import base64
from typing import Iterable, List, Set
from urllib.parse import parse_qsl, quote, unquote, unquote_plus, urlsplit

MASK = "***"
#: Shorter secrets are not masked: replacing "ab" everywhere would mangle every line (validate warns).
MIN_SECRET = 3
#: The characters urllib and http.client leave unquoted when they quote a URL (a redirect's, a request line's).
_SAFE = ("", "/", "/%", "%/:=&?~#+!$,;'@()*[]|")
#: A URL's path, query or fragment this short carries no secret ("/hook"): masking it would mangle words.
URL_PART_MIN = 6


class Masker:
    """Replaces every secret value, and each line of a multi-line one, with ***; a secret URL also by each
    of its parts, in every form an error text may quote it (url_parts)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        parts: Set[str] = set()
        for secret in secrets:
            parts.add(secret)
            for line in secret.splitlines():
                parts.update((line, line.strip()))
            if "://" in secret:
                parts.update(url_parts(secret))
        self.parts: List[str] = sorted((p for p in parts if len(p) >= MIN_SECRET), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for part in self.parts:
            if part in text:
                text = text.replace(part, MASK)
        return text

    def cut(self, text: str, limit: int, *, keep_end: bool = False) -> str:
        """Mask, then shorten to `limit` characters (the start, or the end): no cut shows part of a secret."""
        text = self(text)
        if len(text) <= limit:
            return text
        return text[-limit:] if keep_end else text[:limit]


def url_parts(url: str) -> Set[str]:
    """Every part of a URL that may carry its secret (the userinfo and its password, the path, the query and
    each of its values, the fragment; the URL without its scheme or its userinfo), each as written, unquoted
    and quoted the ways urllib and http.client quote: an error text that quotes any of them shows ***."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # not a URL urllib can read (a bad IPv6 host): its pieces still go
        return _forms(url.split("://", 1)[-1])
    found = {url.split("://", 1)[-1]}
    userinfo, _, host = parts.netloc.rpartition("@")
    credentials: Set[str] = set()
    if userinfo:
        _, colon, password = userinfo.partition(":")
        credentials.update((userinfo, password) if colon else (userinfo,))
        credentials.add(base64.b64encode(unquote(userinfo).encode()).decode())  # as Basic auth sends it
        found.add(url.replace(userinfo + "@", "", 1))
    selector = parts.path + ("?" + parts.query if parts.query else "")
    found.update((selector, parts.path, parts.path.lstrip("/"), parts.query, parts.fragment))
    if selector.strip("/"):
        found.add(host + selector)
    found.update(value for _, value in parse_qsl(parts.query, keep_blank_values=True))
    out: Set[str] = set()
    for part in credentials:
        out |= _forms(part)
    for part in found:
        out |= {form for form in _forms(part) if len(form) >= URL_PART_MIN}
    return {p for p in out if p and p != host}


def _forms(part: str) -> Set[str]:
    """A part as written, unquoted, and quoted with each safe set urllib uses."""
    plain = {part, unquote(part), unquote_plus(part)}
    return plain | {quote(p, safe=safe) for p in plain for safe in _SAFE}
