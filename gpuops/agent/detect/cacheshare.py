"""Other runs that write to this run's inductor cache: their compiles are not this run's.

Two runs in one container share the default inductor cache (``/tmp/torchinductor_<user>``); a
second run's warmup then adds files that the first run's compile-after-warmup would count as its
own. A file does not say which process wrote it, and a cache per run would lose the warm cache
that warmup exists to make (warmup and training of a run must share it, and it must outlive the
run). So the watchdog asks, whenever new files appeared, whether another run could have written
them: a live process of another run (its environment holds another GPUOPS_RUN_ID) whose cache
is this one, or another run whose directory changed since the last look (a heartbeat, a phase)
and whose env points at this cache. If one could, the new files are not counted (the detector
says so once, in a ``cache-shared`` note); ``watch.recompiles: true`` still judges this run from
its own log's ``Recompiling function`` lines.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, List, Mapping, Set

from ..wire import watchfile
from ..wire.protocol import RUN_ID_ENV
from .cachewatch import inductor_cache_dir

__all__ = ["CacheSharing"]

_RUN_ID = RUN_ID_ENV.encode() + b"="
#: Bytes of a process's environment read (its GPUOPS_RUN_ID and the cache variables are within).
ENVIRON_BYTES = 1 << 20


def _environ(data: bytes) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in data.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


class CacheSharing:
    """Which other runs may have written to `cache_dir` (see the module docstring)."""

    def __init__(self, runs_dir: str, me: str, cache_dir: str, base_env: Mapping[str, str], proc: str = "/proc") -> None:
        self.runs_dir, self.me, self.proc = runs_dir, me, proc
        self.cache_dir = os.path.realpath(cache_dir)
        self.base_env = dict(base_env)

    def others(self, since: float) -> List[str]:
        """Run ids of other runs alive now, or active since `since` (epoch seconds), that use this cache."""
        return sorted(self._processes() | self._active(since))

    def _same(self, environ: Mapping[str, str]) -> bool:
        return os.path.realpath(inductor_cache_dir(environ)) == self.cache_dir

    def _processes(self) -> Set[str]:
        found: Set[str] = set()
        try:
            pids = [n for n in os.listdir(self.proc) if n.isdigit()]
        except OSError:
            return found
        for pid in pids:
            try:
                with open(os.path.join(self.proc, pid, "environ"), "rb") as fh:
                    data = fh.read(ENVIRON_BYTES)
            except OSError:  # gone, or another user's (its cache is its user's)
                continue
            if _RUN_ID not in data:
                continue
            env = _environ(data)
            run = env.get(RUN_ID_ENV, "")
            if run and run != self.me and run not in found and self._same(env):
                found.add(run)
        return found

    def _active(self, since: float) -> Set[str]:
        found: Set[str] = set()
        for name in self._names():
            d = os.path.join(self.runs_dir, name)
            try:
                changed = os.stat(d).st_mtime  # records are renamed into place: every heartbeat and phase
            except OSError:
                continue
            if changed >= since - 1.0 and self._same({**self.base_env, **self._env(d)}):
                found.add(name)
        return found

    def _names(self) -> Iterable[str]:
        try:
            return [n for n in os.listdir(self.runs_dir) if n != self.me]
        except OSError:
            return []

    @staticmethod
    def _env(d: str) -> Dict[str, str]:
        """The other run's env as its watch.json has it ({} when it has none it can read)."""
        cfg = watchfile.read(d)
        return dict(cfg.env) if cfg is not None else {}
