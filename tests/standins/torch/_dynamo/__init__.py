"""torch._dynamo, the stand-in: optimize() and the counters the real one keeps."""

from .eval_frame import OptimizedModule, counters, optimize, reset  # noqa: F401  (torch._dynamo's names)
