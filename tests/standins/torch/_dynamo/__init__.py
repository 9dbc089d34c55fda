"""torch._dynamo, the stand-in: optimize() and the counters the real one keeps."""

from .eval_frame import OptimizedModule, optimize, reset  # noqa: F401
from .eval_frame import counters  # noqa: F401
