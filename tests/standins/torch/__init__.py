"""A strict stand-in for the parts of PyTorch the compile guard meets (tests/test_guard*.py).

Only what the guard touches, each as PyTorch 2.11 spells it: ``torch.compile`` with its real
signature and both decorator forms; ``Tensor`` (shape, stride(), dtype, device, requires_grad);
``nn.Module`` with ``compile()`` (``torch.compile(self._call_impl)``); grad mode and the default dtype (global state dynamo guards on); and a compiled
object that misbehaves as the real one does before 2.14 (REFERENCE.md, "PyTorch failure
texts"): its first call per guard set traces with a process-global FX flag set, for
TORCH_STANDIN_COMPILE_SECONDS (default 0.2), and any compiled call that starts while that flag
is set raises the real RuntimeError. Its backward is compiled lazily, as AOTAutograd does: the
first ``.backward()`` through a compiled node traces with the same flag set, on the calling thread
and outside the compiled call (the real one runs it on the autograd engine's device thread, where
it deadlocked against another thread's forward compile on the H200). Nothing here computes:
tensors carry metadata only.
"""

import os

__version__ = "2.11.0+standin"
#: How long a first call per guard set traces (with the FX flag set).
COMPILE_SECONDS = float(os.environ.get("TORCH_STANDIN_COMPILE_SECONDS", "0.2"))


class dtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


float32 = dtype("float32")
float16 = dtype("float16")
bfloat16 = dtype("bfloat16")
int64 = dtype("int64")
float = float32  # noqa: A001 - torch.float
_DTYPES = {"float32": float32, "float16": float16, "bfloat16": bfloat16, "int64": int64}


class device:
    def __init__(self, type, index=None):  # noqa: A002 - torch.device(type, index)
        if isinstance(type, device):
            type, index = type.type, type.index
        elif ":" in type:
            type, _, idx = type.partition(":")
            index = int(idx)
        if type not in ("cpu", "cuda", "meta"):
            raise RuntimeError("Expected one of cpu, cuda, meta device type at start of device string: " + type)
        self.type, self.index = type, index

    def __eq__(self, other):
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __repr__(self):
        return "device(type=%r%s)" % (self.type, "" if self.index is None else ", index=%d" % self.index)


class Size(tuple):
    def __repr__(self):
        return "torch.Size([%s])" % ", ".join(str(x) for x in self)


class Tensor:
    """Metadata only. A new shape, stride, dtype, device or requires_grad is a new dynamo guard set."""

    def __init__(self, shape, dtype=float32, device_="cpu", requires_grad=False, strides=None):
        self._shape = Size(shape)
        self._strides = tuple(strides) if strides is not None else _contiguous(self._shape)
        self._dtype = dtype
        self._device = device(device_)
        self.requires_grad = requires_grad
        self.grad_fn = None  # an autograd node when the tensor came out of a compiled call that needs grad

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def device(self):
        return device(self._device)  # a new object each time, as the real property returns

    def stride(self):
        return self._strides

    def t(self):
        """The transpose of a 2-d tensor: the same storage, strides swapped."""
        a, b = self._shape
        return Tensor((b, a), self._dtype, self._device, self.requires_grad, self._strides[::-1])

    def to(self, target):
        if isinstance(target, dtype):
            return Tensor(self._shape, target, self._device, self.requires_grad)
        return Tensor(self._shape, self._dtype, target, self.requires_grad)

    def __add__(self, other):
        return Tensor(self._shape, self._dtype, self._device, self.requires_grad)

    __mul__ = __radd__ = __add__

    def sum(self):
        """A scalar whose grad_fn is a SumBackward0 over this tensor's node (the guard walks through it)."""
        out = Tensor((), self._dtype, self._device, self.requires_grad)
        if self.grad_fn is not None:
            out.grad_fn = autograd.graph.Node("SumBackward0", (self.grad_fn,))
        return out

    def backward(self):
        if self.grad_fn is None:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        autograd.graph.run_backward(self.grad_fn)

    def __repr__(self):
        return "tensor(shape=%s, dtype=%r, device=%r)" % (list(self._shape), self._dtype, self._device)


def _contiguous(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def randn(*size, dtype=None, device="cpu", requires_grad=False):  # noqa: A002
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return Tensor(size, dtype or float32, device, requires_grad)


zeros = ones = randn

_grad_enabled = [True]
_default_dtype = [float32]


def get_default_dtype():
    return _default_dtype[0]


def set_default_dtype(d):
    """Process-global state dynamo guards on (its global state guard): a change recompiles."""
    _default_dtype[0] = d


def is_grad_enabled():
    return _grad_enabled[0]


class no_grad:
    def __enter__(self):
        self._prev = _grad_enabled[0]
        _grad_enabled[0] = False

    def __exit__(self, *exc):
        _grad_enabled[0] = self._prev


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None,  # noqa: A001
            disable=False):
    """Optimizes given model/function using TorchDynamo and specified backend (the real signature)."""
    if model is None:
        def fn(model):
            if model is None:
                raise RuntimeError("Model can't be None")
            return compile(model, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options,
                           disable=disable)
        return fn
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    return _dynamo.optimize(backend, nopython=fullgraph, dynamic=dynamic, disable=disable)(model)


from . import autograd, nn  # noqa: E402, F401 - torch.nn and torch.autograd, imported last as torch/__init__.py does

# isort: split
# _dynamo after nn: its OptimizedModule subclasses torch.nn.Module when it is imported
from . import _dynamo  # noqa: E402
