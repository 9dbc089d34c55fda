"""New files in the inductor cache since training started: a shape the warmup missed compiles again."""

from __future__ import annotations

import getpass
import os
import re
from typing import Iterable, List, Mapping, Set, Tuple

__all__ = ["CacheWatcher", "inductor_cache_dir"]


def inductor_cache_dir(environ: Mapping[str, str]) -> str:
    """Where torch.compile caches kernels for a run with this environment: torch's default_cache_dir() rule.

    (TRITON_CACHE_DIR, when set, moves triton/ elsewhere; watch that folder too.)
    """
    if environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return environ["TORCHINDUCTOR_CACHE_DIR"]
    user = next((environ[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if environ.get(k)), None)
    if user is None:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())
    tmp = next((environ[k] for k in ("TMPDIR", "TEMP", "TMP") if environ.get(k)), "/tmp")
    return os.path.join(tmp, "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


class CacheWatcher:
    """Counts regular files under the inductor cache that were not there at the snapshot.

    A shape the warmup missed adds ~50 files (triton/, fxgraph/, aotautograd/ and two-letter
    folders of generated code, REFERENCE.md); the eager fallback itself adds none. The walk visits
    at most `limit` entries (``truncated`` says it stopped early: files past the limit are not
    seen), follows no symlinks and skips lock and temporary files, which come and go on cache hits.
    A missing folder holds 0 files. Walking 20,000 entries takes tens of milliseconds: poll every
    10-30 s, not every sample.
    """

    EXAMPLES = 5

    def __init__(self, path: str, limit: int = 20000) -> None:
        self.path = path
        self.limit = limit
        self.truncated = False
        self._seen: Set[str] = set()

    def snapshot(self) -> int:
        """Remember what is there now (at training start); returns how many files that is."""
        self._seen = set(self._walk())
        return len(self._seen)

    def seen(self) -> List[str]:
        """The files of the snapshot (to keep, so a restarted watchdog judges against the same one)."""
        return sorted(self._seen)

    def restore(self, names: Iterable[str]) -> None:
        """Take a kept snapshot back instead of making a new one."""
        self._seen = set(names)

    def absorb(self) -> None:
        """Take what is there now into the snapshot (files another run may have written are not this run's)."""
        self._seen |= set(self._walk())

    def new_files(self) -> Tuple[int, List[str]]:
        """How many files appeared since the snapshot, and a few of them (paths relative to the cache)."""
        new = sorted(p for p in self._walk() if p not in self._seen)
        return len(new), new[:self.EXAMPLES]

    def _walk(self) -> List[str]:
        found: List[str] = []
        stack, visited = [""], 0
        self.truncated = False
        while stack:
            rel = stack.pop()
            try:
                entries = list(os.scandir(os.path.join(self.path, rel) if rel else self.path))
            except OSError:
                continue
            for entry in entries:
                visited += 1
                if visited > self.limit:
                    self.truncated = True
                    return found
                name = rel + "/" + entry.name if rel else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(name)
                    elif entry.is_file(follow_symlinks=False) and not _transient(entry.name):
                        found.append(name)
                except OSError:
                    continue
        return found


def _transient(name: str) -> bool:
    return name.endswith(".lock") or ".tmp" in name
