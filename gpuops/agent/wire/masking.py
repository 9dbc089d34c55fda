"""Secrets out of everything gpuops says: the one place text is masked, always before it is shortened."""

from __future__ import annotations

from typing import Iterable, List

MASK = "***"
#: Shorter secrets are not masked: replacing "ab" everywhere would mangle every line (validate warns).
MIN_SECRET = 3


class Masker:
    """Replaces every secret value, and each line of a multi-line one, with ***."""

    def __init__(self, secrets: Iterable[str]) -> None:
        parts = set()
        for secret in secrets:
            parts.add(secret)
            for line in secret.splitlines():
                parts.update((line, line.strip()))
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
