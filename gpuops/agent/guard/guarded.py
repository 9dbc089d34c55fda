"""``torch.compile`` replaced: what it returns is guarded, so a call with an argument signature the
compiled object has not seen runs alone (the exclusive side of rwlock) and every other call runs
under the shared side. Functions, modules, both decorator forms and ``nn.Module.compile()``
(which calls ``torch.compile(self._call_impl)``) all come through here.
"""

from __future__ import annotations

import functools
import sys
import time
from _thread import get_ident

from . import backward, call_signature, counts, rwlock

_READERS, _BUSY, _WRITER = rwlock.READERS, rwlock.BUSY, rwlock.WRITER
_skipped = [False]


def _first_call(compiled: object, seen: dict, key: object, args: tuple, kwargs: dict) -> object:
    """A call whose signature was not seen: under the exclusive side (re-entrant), then remembered."""
    me = get_ident()
    if _WRITER[0] == me:  # a compiled call inside our own first call: we hold the lock already
        result = compiled(*args, **kwargs)  # type: ignore[operator]
        seen[key] = True
        return result
    held = rwlock.acquire_exclusive(me)
    kept = False
    try:
        if key in seen:  # another thread's first call of this signature ran while we waited
            return compiled(*args, **kwargs)  # type: ignore[operator]
        start = time.monotonic()
        result = compiled(*args, **kwargs)  # type: ignore[operator]
        seen[key] = True
        counts.COUNTS.serialized += 1
        counts.COUNTS.first_call_s += time.monotonic() - start
        # Not nested in a shared hold of ours: the lazy backward compile is kept exclusive too.
        kept = held == 0 and backward.hold_for_backward(me, result)
        return result
    finally:
        if not kept:
            rwlock.release_exclusive(me, held)


def guard_callable(compiled: object, grad_enabled: object, module: object = None) -> object:
    """A function calling `compiled` under the lock; `module`: whose `training` flag is part of the key."""
    seen: dict = {}
    key_of, append, remove, busy = call_signature.key_of, _READERS.append, _READERS.remove, _BUSY
    shared_slow, wake = rwlock.shared_slow, rwlock.wake

    # Two closures on purpose: a compiled call's hot path reads `module.training` only when there is
    # a module, without a branch per call (the < 5 us budget); the rest of the two is the same.
    if module is None:
        def guarded(*args, **kwargs):
            key = (key_of(args, kwargs), grad_enabled())  # type: ignore[operator]
            if key not in seen:
                return _first_call(compiled, seen, key, args, kwargs)
            me = get_ident()
            append(me)
            try:
                if busy[0]:
                    shared_slow(me)
                return compiled(*args, **kwargs)  # type: ignore[operator]
            finally:
                remove(me)
                if busy[0]:
                    wake()
    else:
        def guarded(*args, **kwargs):
            key = (key_of(args, kwargs), grad_enabled(), module.training)  # type: ignore[attr-defined,operator]
            if key not in seen:
                return _first_call(compiled, seen, key, args, kwargs)
            me = get_ident()
            append(me)
            try:
                if busy[0]:
                    shared_slow(me)
                return compiled(*args, **kwargs)  # type: ignore[operator]
            finally:
                remove(me)
                if busy[0]:
                    wake()

    # functools.wraps copies the compiled object's __dict__: its `_torchdynamo_inline` makes dynamo,
    # tracing an outer compiled function that calls this one, inline the original (not this wrapper).
    if hasattr(compiled, "__dict__"):
        functools.update_wrapper(guarded, compiled)  # type: ignore[arg-type]
    guarded._gpuops_compile_guard = True  # type: ignore[attr-defined]
    counts.COUNTS.compiled += 1
    return guarded


#: The guard's own code (the two call wrappers included): dynamo's frame hook skips it, and still
#: sees the frames the guard calls.
CODES = [f.__code__ for f in (_first_call, call_signature.key_of, call_signature.one, call_signature._kind, rwlock.shared_slow, rwlock.wake,
                               rwlock.acquire_exclusive, rwlock.release_exclusive)]
CODES += [c for c in guard_callable.__code__.co_consts if isinstance(c, type(guard_callable.__code__))]


def _skip_own_frames() -> None:
    """Once dynamo is loaded: tell it not to trace the guard's frames (torch._dynamo.eval_frame.skip_code)."""
    if _skipped[0]:
        return
    skip = getattr(sys.modules.get("torch._dynamo.eval_frame"), "skip_code", None)
    if skip is None:
        return
    _skipped[0] = True
    for code in CODES:
        skip(code)


def wrap(torch: object, model: object, result: object) -> object:
    """What torch.compile returned, guarded: a compiled module keeps its type (its forward is wrapped)."""
    grad_enabled = torch.is_grad_enabled  # type: ignore[attr-defined]
    module_type = torch.nn.Module  # type: ignore[attr-defined]
    if result is model:  # nothing was compiled (a backend that returns its input)
        return result
    if isinstance(result, module_type):
        forward = vars(result).get("forward")
        if forward is None:
            counts.COUNTS.unguarded += 1
            sys.stderr.write("gpuops compile guard: cannot guard a compiled %s (no instance forward); "
                             "its calls are not serialized\n" % type(result).__name__)
            return result
        inner = getattr(result, "_orig_mod", result)
        guarded = guard_callable(forward, grad_enabled, inner)
        _skip_own_frames()
        object.__setattr__(result, "forward", guarded)
        return result
    owner = getattr(model, "__self__", None)  # nn.Module.compile(): torch.compile(self._call_impl)
    guarded = guard_callable(result, grad_enabled, owner if isinstance(owner, module_type) else None)
    _skip_own_frames()
    return guarded


def make_compile(torch: object, original: object) -> object:
    """The replacement of torch.compile: the same signature, both decorator forms, guarded results."""

    @functools.wraps(original)  # type: ignore[arg-type]
    def compile(model=None, *args, **kwargs):  # noqa: A001 - it is torch.compile
        if model is None:
            def decorator(model):
                if model is None:
                    raise RuntimeError("Model can't be None")
                return compile(model, *args, **kwargs)
            return decorator
        result = original(model, *args, **kwargs)  # type: ignore[operator]
        if kwargs.get("disable"):
            return result
        counts.start()
        return wrap(torch, model, result)

    compile._gpuops_compile_guard = True  # type: ignore[attr-defined]
    return compile


def install(torch: object) -> None:
    """Replace torch.compile in an imported torch (once)."""
    original = getattr(torch, "compile", None)
    if original is None or getattr(original, "_gpuops_compile_guard", False):
        return
    call_signature.TENSOR[0] = getattr(torch, "Tensor", None)
    if call_signature.TENSOR[0] is not None:
        call_signature.KINDS[call_signature.TENSOR[0]] = "t"
    torch.compile = make_compile(torch, original)  # type: ignore[attr-defined]
