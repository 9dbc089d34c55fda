"""The compile guard's argument signature (gpuops/agent/guard/call_signature.py): two calls get the same key
exactly when dynamo would reuse the same compiled code for them (as far as the arguments say)."""

from __future__ import annotations

import pytest

from gpuops.agent.guard import call_signature


class Tensor:
    """Tensor metadata as torch exposes it: shape, stride(), dtype, device, requires_grad."""

    def __init__(self, shape, dtype="float32", device="cuda:0", requires_grad=False, strides=None) -> None:
        self.shape, self.dtype, self.device, self.requires_grad = tuple(shape), dtype, device, requires_grad
        self._strides = strides or tuple(int(s) for s in _contiguous(shape))

    def stride(self):
        return self._strides


class Parameter(Tensor):
    pass


def _contiguous(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return reversed(out)


@pytest.fixture(autouse=True)
def tensor_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_signature, "TENSOR", [Tensor])
    monkeypatch.setattr(call_signature, "KINDS", {**call_signature.KINDS, Tensor: "t"})


def key(*args, **kwargs):
    return call_signature.key_of(args, kwargs)


T = Tensor((4, 32))  # read when a case runs (the fixture has made Tensor a tensor type by then)

DIFFERENT = [
    ("shape", lambda: (key(Tensor((4, 32))), key(Tensor((4, 64))))),
    ("dtype", lambda: (key(Tensor((4, 32))), key(Tensor((4, 32), dtype="bfloat16")))),
    ("device", lambda: (key(Tensor((4, 32))), key(Tensor((4, 32), device="cuda:1")))),
    ("requires_grad", lambda: (key(Tensor((4, 32))), key(Tensor((4, 32), requires_grad=True)))),
    ("stride (a transpose)", lambda: (key(Tensor((4, 4))), key(Tensor((4, 4), strides=(1, 4))))),
    ("tensor subclass", lambda: (key(Tensor((4, 32))), key(Parameter((4, 32))))),
    ("nested list", lambda: (key([T, [Tensor((2,))]]), key([T, [Tensor((3,))]]))),
    ("list vs tuple", lambda: (key([T]), key((T,)))),
    ("nested tuple", lambda: (key((T, (1, 2))), key((T, (1, 3))))),
    ("dict value", lambda: (key({"q": T, "k": Tensor((1,))}), key({"q": T, "k": Tensor((2,))}))),
    ("dict keys", lambda: (key({"q": T}), key({"k": T}))),
    ("int value", lambda: (key(T, 1), key(T, 2))),
    ("float value", lambda: (key(T, 0.5), key(T, 0.25))),
    ("bool vs int", lambda: (key(T, True), key(T, 1))),
    ("bool value", lambda: (key(T, True), key(T, False))),
    ("str value", lambda: (key(T, "causal"), key(T, "full"))),
    ("None vs 0", lambda: (key(T, None), key(T, 0))),
    ("keyword value", lambda: (key(T, scale=1), key(T, scale=2))),
    ("keyword vs positional", lambda: (key(T, 1), key(T, scale=1))),
    ("number of arguments", lambda: (key(T), key(T, T))),
    ("other types by type", lambda: (key(T, object()), key(T, ValueError()))),
]

SAME = [
    ("equal metadata, other tensor", lambda: (key(Tensor((4, 32))), key(Tensor((4, 32))))),
    ("other objects of one type", lambda: (key(T, object()), key(T, object()))),
    ("equal nested containers", lambda: (key([T, {"a": (1, "x")}]), key([Tensor((4, 32)), {"a": (1, "x")}]))),
]


@pytest.mark.parametrize("what,pair", DIFFERENT, ids=[d[0] for d in DIFFERENT])
def test_what_dynamo_guards_on_makes_a_new_signature(what, pair) -> None:
    a, b = pair()
    assert a != b and hash(a) is not None


@pytest.mark.parametrize("what,pair", SAME, ids=[s[0] for s in SAME])
def test_what_it_does_not_guard_on_keeps_the_signature(what, pair) -> None:
    a, b = pair()
    assert a == b and hash(a) == hash(b)


def test_a_subclass_of_a_container_or_scalar_is_keyed_like_its_base() -> None:
    class Shape(tuple):
        pass

    class Big(int):
        pass

    assert key(Shape((1, 2))) != key(Shape((1, 3)))
    assert key(Big(3)) != key(Big(4))
