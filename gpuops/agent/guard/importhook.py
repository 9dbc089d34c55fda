"""The import hook: a ``sys.meta_path`` finder that answers only for ``torch``, so that once torch's
module has run, what gpuops does to it is done: ``torch.compile`` becomes the guard's (the compile guard),
the process group's default timeout becomes the job's (guard/pg_timeout.py). A process that never imports
torch pays one string comparison per import; after torch ran the finder takes itself off the list.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Callable, List, Optional, Sequence


class _PatchingLoader:
    """torch's own loader, with the patch applied once its module ran."""

    def __init__(self, loader: object, finder: "TorchFinder") -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: object) -> None:
        # torch sees its real loader while it runs (and after): this one only wraps the call.
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader  # type: ignore[attr-defined]
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        self._finder.patched(module)

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


class TorchFinder:
    """Finds nothing itself: for `torch` it asks the finders after it and wraps the loader found."""

    def __init__(self) -> None:
        self.callbacks: List[Callable[[Any], None]] = []  # what runs once torch's module ran, in order

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[ModuleSpec]:
        if name != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, self)
        return spec

    def patched(self, torch: object) -> None:
        """torch ran: each callback applied, and the finder leaves sys.meta_path."""
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for callback in self.callbacks:
            callback(torch)


def after_torch(callback: Callable[[Any], None]) -> None:
    """callback(torch) once the process imports torch (now, where it has): one finder first on sys.meta_path."""
    torch = sys.modules.get("torch")
    if torch is not None:
        callback(torch)
        return
    finder = next((f for f in sys.meta_path if isinstance(f, TorchFinder)), None)
    if finder is None:
        finder = TorchFinder()
        sys.meta_path.insert(0, finder)
    finder.callbacks.append(callback)


def _guard(torch: object) -> None:
    from . import guarded  # here: a process that never imports torch never loads the guard

    guarded.install(torch)


def install() -> None:
    """The compile guard: torch.compile replaced once torch is imported (or now, where it is)."""
    after_torch(_guard)
