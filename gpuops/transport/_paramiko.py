"""Import paramiko without paying for invoke up front.

paramiko.config imports invoke (50-90 ms here: it pulls in asyncio and unittest.mock) only to
run `Match exec` lines of ~/.ssh/config. A stand-in module takes its place until one of its
attributes is really used; then the real invoke is imported and used from then on.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _Deferred(types.ModuleType):
    """Imports the real module on first attribute use (module.__spec__ is None until then)."""

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


if "invoke" not in sys.modules:
    sys.modules["invoke"] = _Deferred("invoke")

import paramiko  # noqa: E402

__all__ = ["paramiko"]
