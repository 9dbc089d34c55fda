"""The built-in rule list: each built-in rule declared once, as data both sides read.

The agent's matcher compiles them (signatures/rules.builtin_rules); the playbook loader takes their
names and default actions from here (watch.builtin_rules, restart.on) without compiling a pattern, and
a match carries its rule's `advice`. Add a rule: one entry in BUILTIN (docs/architecture.md).
Standard library only.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

__all__ = ["BUILTIN", "Builtin", "FX_ADVICE", "GUARD_HOWTO", "advice", "default_actions", "names"]

#: torchrun's per-rank prefix ([rank0]: ), optional at the start of a line.
RANK = r"(?:\[(?:rank|default)\d+\]:\s?)?"

#: How to make the run succeed after the FX thread-safety family: shown with its matches (`advice`).
#: No PyTorch version is named: none was verified to end the race (PyTorch made its tracing flag
#: thread-local in pytorch#168999 and the FX patcher in pytorch#187589).
GUARD_HOWTO = ("turn on gpuops' compile guard (`launch.compile_guard: true`: the first calls of compiled code never "
               "overlap, no code change) and let the watchdog restart a run that still hits it (`restart: {max: 2, "
               "on: [fx-tracing-race, fx-patcher-race, stall], compile_guard: true}`)")
FX_ADVICE = ("threads traced or compiled at once (torch.compile is not thread-safe): " + GUARD_HOWTO
             + "; or compile each device's function under one lock before the threads start")


class Builtin(NamedTuple):
    """One built-in rule. kind `exception`: the pattern must match a Python traceback's exception line;
    `line`: searched in each line (with `follow`, a line within `follow_within` lines after it must match
    `follow` too). `triggers`: literals every line the rule matches contains (the matcher skips lines
    without any; none for an exception rule). `advice`: what to do, said with its matches."""

    name: str
    kind: str
    action: str
    description: str
    pattern: str
    triggers: Tuple[str, ...] = ()
    follow: str = ""
    follow_within: int = 0
    advice: Optional[str] = None


#: The built-in rules, in priority order (the first that matches a line wins).
BUILTIN: Tuple[Builtin, ...] = (
    # Threads sharing torch.compile raced; drafters fall back to eager mode and the run crawls on.
    Builtin("fx-tracing-race", "exception", "abort", "PyTorch FX-tracing race between threads sharing torch.compile",
            r"[A-Za-z_][\w.]*: Detected that you are using FX to symbolically trace a dynamo-optimized function",
            advice=FX_ADVICE),
    # Raised in torch/fx/_symbolic_trace.py: the same family, hit by the eager fallback's make_fx (torch 2.11).
    Builtin("fx-patcher-race", "exception", "abort",
            "PyTorch FX thread-safety race: threads tracing at once (the eager fallback's make_fx patcher is "
            "process-global); a drafter thread died and the rest run on",
            r"AssertionError: CURRENT_PATCHER is None in finally block", advice=FX_ADVICE),
    # torch.OutOfMemoryError (also torch.cuda.OutOfMemoryError and RuntimeError: CUDA out of memory).
    Builtin("cuda-oom", "exception", "abort", "CUDA out of memory",
            r"(?:torch\.(?:cuda\.)?OutOfMemoryError|RuntimeError): CUDA out of memory"),
    # torch.AcceleratorError / RuntimeError: CUDA error: (illegal memory access, device-side assert, ...).
    Builtin("cuda-error", "exception", "abort", "CUDA error (illegal memory access, device-side assert, ...)",
            r"(?:torch\.AcceleratorError|RuntimeError|torch\.cuda\.CudaError): CUDA error: "),
    # ProcessGroupNCCL's log line.
    Builtin("nccl-watchdog-timeout", "line", "abort", "NCCL watchdog: a collective operation timed out",
            r"Watchdog caught collective operation timeout", triggers=("Watchdog caught collective operation timeout",)),
    # torch.distributed.DistBackendError: NCCL error in: ..., and NCCL communicator was aborted.
    Builtin("nccl-error", "exception", "abort", "NCCL error in a collective operation",
            r"[A-Za-z_][\w.]*: (?:\[[^\]]*\]\s*)*(?:NCCL error\b|NCCL communicator was aborted)"),
    Builtin("compile-failed", "exception", "abort", "torch.compile failed (backend compiler / inductor error)",
            r"torch\._dynamo\.exc\.BackendCompilerFailed:|torch\._inductor\.exc\.InductorError:"),
    # faulthandler's `Fatal Python error: ...` (SIGSEGV, SIGABRT, ...) and bash's `Segmentation fault (core dumped)`.
    Builtin("segfault", "line", "abort", "the process crashed (segmentation fault or another fatal error)",
            "^" + RANK + r"Fatal Python error: \S"
            r"|^(?:\S.*: line \d+: +\d+ |\[\d+\][+-]? +(?:\d+ +)?)Segmentation fault\b"
            r"|^Segmentation fault(?: +\(core dumped\))?\s*$",
            triggers=("Fatal Python error: ", "Segmentation fault")),
    # faulthandler's `Timeout (0:04:00)!` followed within 5 lines by a thread's stack: the process hung.
    Builtin("faulthandler-timeout", "line", "abort", "the process hung: faulthandler's timeout dumped its stacks",
            "^" + RANK + r"Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!\s*$", triggers=("Timeout (",),
            follow="^" + RANK + r"(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+ |Stack )\(most recent call first\):",
            follow_within=5),
    # The run is on the unfused slow path.
    Builtin("flex-attention-unfused", "line", "warn",
            "flex_attention ran without torch.compile: the unfused slow path (the eager fallback), "
            "materialising the full scores matrix",
            r"UserWarning: flex_attention called without torch\.compile\(\)",
            triggers=("flex_attention called without torch.compile",)),
    # Older torch says cache_size_limit: warmup did not cover a shape; dynamo runs eager.
    Builtin("recompile-limit", "line", "warn", "torch._dynamo hit its recompile limit: warmup did not cover a shape",
            r"(?:torch\._dynamo|torchdynamo) hit config\.\w*(?:recompile_limit|cache_size_limit) \(\d+\)",
            triggers=("dynamo hit config.",)),
)


def names() -> Tuple[str, ...]:
    return tuple(rule.name for rule in BUILTIN)


def default_actions() -> Dict[str, str]:
    """Each built-in rule's action when the playbook does not change it."""
    return {rule.name: rule.action for rule in BUILTIN}


def advice(rule: str) -> Optional[str]:
    """What to do about a match of this built-in rule, if gpuops knows."""
    return next((r.advice for r in BUILTIN if r.name == rule), None)
