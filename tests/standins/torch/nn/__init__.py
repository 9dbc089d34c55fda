"""torch.nn, the stand-in: Module (with compile()) and Linear."""

import torch


class Module:
    def __init__(self):
        self.training = True
        self._compiled_call_impl = None

    def forward(self, *args, **kwargs):
        raise NotImplementedError('Module [%s] is missing the required "forward" function' % type(self).__name__)

    def _call_impl(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def __call__(self, *args, **kwargs):  # torch's _wrapped_call_impl
        if self._compiled_call_impl is not None:
            return self._compiled_call_impl(*args, **kwargs)
        return self._call_impl(*args, **kwargs)

    def compile(self, *args, **kwargs):
        """Compile this Module's forward using torch.compile (as torch/nn/modules/module.py does)."""
        self._compiled_call_impl = torch.compile(self._call_impl, *args, **kwargs)

    def train(self, mode=True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)


class Linear(Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = torch.Tensor((out_features, in_features), requires_grad=True)

    def forward(self, x):
        return torch.Tensor(tuple(x.shape[:-1]) + (self.weight.shape[0],), x.dtype, x.device, x.requires_grad)
