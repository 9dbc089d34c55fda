"""The argument signature of a compiled call: what dynamo guards on, as a cheap hashable key.

Tensors: (type, shape, stride, dtype, device, requires_grad); tuples, lists and dicts: their
items' keys, nested; int, float, bool, str, None (and other immutable scalars): type and value;
anything else: its type. Built with one dict lookup per value (its type's kind), no isinstance
chain on the common path: a positional tensor costs four attribute reads and a stride call.
"""

from __future__ import annotations

from typing import List

#: Types whose instances are keyed by value (dynamo specializes on these values).
SCALARS = {int: 1, float: 1, bool: 1, str: 1, type(None): 1, bytes: 1, complex: 1}
#: type -> kind, filled as types are met: "t" tensor, "v" by value, "c" tuple/list, "d" dict, "o" by type.
KINDS = {int: "v", float: "v", bool: "v", str: "v", type(None): "v", bytes: "v", complex: "v",
         tuple: "c", list: "c", dict: "d"}
#: The tensor base class of the torch in this process (set by guarded.install); None before.
TENSOR = [None]


def _kind(t: type) -> str:
    """The kind of a type not met yet (subclasses of tensor, tuple, list, dict included)."""
    base = TENSOR[0]
    if base is not None and issubclass(t, base):
        kind = "t"
    elif issubclass(t, (tuple, list)):
        kind = "c"
    elif issubclass(t, dict):
        kind = "d"
    elif issubclass(t, tuple(SCALARS)) and getattr(t, "__hash__", None) is not None:
        kind = "v"
    else:
        kind = "o"
    KINDS[t] = kind
    return kind


def one(a: object) -> object:
    """The key of one value."""
    t = type(a)
    kind = KINDS.get(t) or _kind(t)
    if kind == "t":
        return (t, a.shape, a.stride(), a.dtype, a.device, a.requires_grad)  # type: ignore[attr-defined]
    if kind == "v":
        return (t, a)
    if kind == "c":
        return (t, tuple([one(x) for x in a]))  # type: ignore[attr-defined]
    if kind == "d":
        return (t, tuple([(k if type(k) in SCALARS else type(k), one(v)) for k, v in a.items()]))  # type: ignore[attr-defined]
    return t


def key_of(args: tuple, kwargs: dict) -> tuple:
    """The key of a call's positional and keyword arguments."""
    kinds = KINDS
    parts: List[object] = []
    for a in args:
        t = type(a)
        kind = kinds.get(t)
        if kind == "t":  # the common case inline: a positional tensor
            parts.append((t, a.shape, a.stride(), a.dtype, a.device, a.requires_grad))  # type: ignore[attr-defined]
        elif kind == "v":
            parts.append((t, a))
        else:
            parts.append(one(a))
    if kwargs:
        parts.append(tuple([(k, one(v)) for k, v in kwargs.items()]))
    return tuple(parts)
