"""Import paramiko without paying for what its import pulls in and gpuops never uses.

- invoke: paramiko.config imports it (50-90 ms here: it pulls in asyncio and unittest.mock)
  only to run `Match exec` lines of ~/.ssh/config. A stand-in module takes its place until one
  of its attributes is really used; then the real invoke is imported and used from then on.
- importlib.metadata: paramiko/__init__ imports it (12-15 ms here: email, zipfile, csv ...)
  only for `metadata.version("paramiko")`. While paramiko is imported, a stand-in answers that
  from the installed .dist-info folder's name; any other use, or no such folder, goes to the
  real module. Afterwards the real module is imported as usual by whoever asks for it.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any


class _Deferred(types.ModuleType):
    """Imports the real module on first attribute use (module.__spec__ is None until then)."""

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


class _QuickMetadata(_Deferred):
    """importlib.metadata's version() for a package installed from a wheel; the rest is deferred."""

    def version(self, name: str) -> str:
        found = _dist_info_version(name)
        return found if found is not None else self.__getattr__("version")(name)


def _dist_info_version(name: str) -> str | None:
    """'5.1.0' from site-packages/paramiko-5.1.0.dist-info beside the imported package, or None."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return None
    folder = os.path.dirname(os.path.dirname(spec.origin))
    prefix = name.replace("-", "_") + "-"
    try:
        found = [e[len(prefix):-len(".dist-info")] for e in os.listdir(folder)
                 if e.startswith(prefix) and e.endswith(".dist-info")]
    except OSError:
        return None
    return found[0] if len(found) == 1 else None  # two versions side by side: let the real module decide


if "invoke" not in sys.modules:
    sys.modules["invoke"] = _Deferred("invoke")

if "importlib.metadata" in sys.modules:
    import paramiko
else:
    sys.modules["importlib.metadata"] = _QuickMetadata("importlib.metadata")
    try:
        import paramiko  # noqa: E402
    finally:
        if isinstance(sys.modules.get("importlib.metadata"), _QuickMetadata):
            del sys.modules["importlib.metadata"]
        if isinstance(getattr(importlib, "metadata", None), _QuickMetadata):
            del importlib.metadata  # `from importlib import metadata` sets the package attribute

__all__ = ["paramiko"]
