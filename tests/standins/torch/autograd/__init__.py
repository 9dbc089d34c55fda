"""torch.autograd, the stand-in: the engine's queue_callback and the nodes' hooks (graph.py)."""

from . import graph  # noqa: F401


class _Engine:
    def queue_callback(self, fn):
        """Run fn when the current backward pass has ended (only valid during one, as the real one)."""
        if graph._callbacks is None:
            raise RuntimeError("Final callbacks can only be installed during backward pass.")
        graph._callbacks.append(fn)


class Variable:
    _execution_engine = _Engine()
