"""The import hook: a ``sys.meta_path`` finder that answers only for ``torch``, so that once torch's
module has run, ``torch.compile`` is the guard's. A process that never imports torch pays one
string comparison per import; after torch is patched the finder takes itself off the list.
"""

from __future__ import annotations

import sys


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

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
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
        """torch ran: replace torch.compile and leave sys.meta_path."""
        from . import guarded

        guarded.install(torch)
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def install() -> None:
    """Put the finder first on sys.meta_path (or patch a torch that is imported already)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        from . import guarded

        guarded.install(torch)
        return
    if not any(isinstance(f, TorchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchFinder())
