"""The stand-in's dynamo: a compiled object with guards, a first call that traces with the
process-global FX flag set (as torch.fx._symbolic_trace did before 2.14), and the real error
for a compiled call that starts meanwhile."""

import collections
import functools
import threading
import time

import torch

FX_ERROR = ("Detected that you are using FX to symbolically trace a dynamo-optimized function. "
            "This is not supported at the moment.")
#: torch.fx._symbolic_trace._is_fx_tracing_flag: set while any thread traces (process-global).
_is_fx_tracing_flag = [0]
_flag_lock = threading.Lock()
counters = collections.defaultdict(collections.Counter)
#: Code objects dynamo's frame hook skips (torch._dynamo.eval_frame.skip_code).
SKIPPED = set()


def skip_code(code):
    SKIPPED.add(code)


def reset():
    counters.clear()


def _guard(value):
    """What dynamo guards on for one value (written apart from the guard's own key, on purpose)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.dtype.name, repr(value.device), value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_guard(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _guard(v)) for k, v in value.items()))
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    return ("type", type(value).__qualname__)


def _trace():
    """Trace and compile with the process-global flag set; a trace that starts while another runs fails."""
    with _flag_lock:
        if _is_fx_tracing_flag[0]:
            raise RuntimeError(FX_ERROR)
        _is_fx_tracing_flag[0] += 1
    try:
        time.sleep(torch.COMPILE_SECONDS)
    finally:
        with _flag_lock:
            _is_fx_tracing_flag[0] -= 1


def _lazy_backward(backwards, guards):
    def compile_backward():
        if guards not in backwards:
            _trace()
            backwards.add(guards)
            counters["backward"]["ok"] += 1
    return compile_backward


def _compile(fn, owner=None):
    """What _TorchDynamoContext.__call__ returns for a function: compile_wrapper."""
    cache = set()
    backwards = set()  # guard sets whose backward was compiled (AOTAutograd compiles it lazily)

    @functools.wraps(fn)
    def compile_wrapper(*args, **kwargs):
        if _is_fx_tracing_flag[0]:
            raise RuntimeError(FX_ERROR)
        guards = (tuple(_guard(a) for a in args), tuple((k, _guard(v)) for k, v in kwargs.items()),
                  torch.is_grad_enabled(), getattr(owner, "training", None), torch.get_default_dtype().name)
        if guards not in cache:
            with _flag_lock:
                _is_fx_tracing_flag[0] += 1
            try:
                time.sleep(torch.COMPILE_SECONDS)  # tracing and compiling take this long
            finally:
                with _flag_lock:
                    _is_fx_tracing_flag[0] -= 1
            cache.add(guards)
            counters["frames"]["ok"] += 1
        out = fn(*args, **kwargs)
        needs_grad = torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args)
        if needs_grad and isinstance(out, torch.Tensor):
            out.requires_grad = True
            out.grad_fn = torch.autograd.graph.Node("CompiledFunctionBackward", (), _lazy_backward(backwards, guards))
        return out

    compile_wrapper._torchdynamo_orig_callable = fn
    compile_wrapper._torchdynamo_inline = fn
    return compile_wrapper


class OptimizedModule(torch.nn.Module):
    """A compiled module: hooks run outside, its forward is the compiled __call__ of the original."""

    def __init__(self, mod):
        super().__init__()
        self._orig_mod = mod
        self.training = mod.training
        self.forward = _compile(mod.__call__, mod)

    def train(self, mode=True):
        self._orig_mod.train(mode)
        return super().train(mode)


def optimize(backend="inductor", *, nopython=False, dynamic=None, disable=False):
    def decorate(model):
        if disable:
            return model
        if isinstance(model, torch.nn.Module):
            return OptimizedModule(model)
        if not callable(model):
            raise RuntimeError("torch.compile: expected a callable, got %s" % type(model).__name__)
        return _compile(model, getattr(model, "__self__", None))
    return decorate
