"""A first call's backward is part of the first call: the exclusive side is held until it ran.

AOTAutograd compiles the backward lazily, at the first ``.backward()`` through the compiled
graph, on the autograd engine's device thread and outside the call that compiled the forward.
Seen on the H200 (torch 2.11, three threads training their own ``nn.Module.compile()``d block):
thread 1's lazy backward compile and thread 2's forward compile (whose flex_attention joint graph
runs ``torch.autograd.grad`` on that same device thread) deadlocked. So when a first call returns
tensors whose graph holds compiled autograd nodes, the exclusive side stays held; it is released
once the backward pass through them has finished (a hook on those nodes queues the release on
the engine, run when the pass ends), or, if no backward comes, after ``WAIT`` seconds.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, List, Optional, Set

from . import counts, rwlock

DEFAULT_WAIT = 300.0


def _wait_seconds(text: Optional[str]) -> float:
    """GPUOPS_COMPILE_GUARD_BACKWARD_WAIT as seconds; a value that is not a number (`300s`) never stops
    the training (this runs at `import torch`): the default, said once on stderr."""
    if not text:
        return DEFAULT_WAIT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value >= 0 and value != float("inf"):
        return value
    sys.stderr.write("gpuops compile guard: GPUOPS_COMPILE_GUARD_BACKWARD_WAIT=%r is not a number of seconds; "
                     "using %g\n" % (text, DEFAULT_WAIT))
    return DEFAULT_WAIT


#: Seconds a first call's backward may take to start before the other threads are let go anyway.
WAIT = _wait_seconds(os.environ.get("GPUOPS_COMPILE_GUARD_BACKWARD_WAIT"))
#: How often a hold looks whether its thread can still run the backward (it ended, or waits idle).
LOOK_EVERY = 0.05
#: Autograd nodes looked at from a result's grad_fn (the walk stops at compiled nodes).
WALK = 256
_COMPILED_NODE = "CompiledFunction"


def _tensors(result: Any, out: List[Any], depth: int = 0) -> List[Any]:
    if depth > 3:
        return out
    if isinstance(result, (tuple, list)):
        for item in result:
            _tensors(item, out, depth + 1)
    elif isinstance(result, dict):
        for item in result.values():
            _tensors(item, out, depth + 1)
    elif getattr(result, "grad_fn", None) is not None:
        out.append(result)
    return out


def compiled_nodes(result: Any) -> List[Any]:
    """The compiled autograd nodes nearest the result's tensors (AOTAutograd's CompiledFunctionBackward)."""
    stack = [t.grad_fn for t in _tensors(result, [])]
    found: List[Any] = []
    seen: Set[int] = set()
    while stack and len(seen) < WALK:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        try:
            name = node.name()
        except Exception:  # noqa: BLE001 - a node kind we do not know: not ours to judge
            continue
        if _COMPILED_NODE in name:
            found.append(node)
            continue
        stack.extend(f for f, _ in getattr(node, "next_functions", ()) if f is not None)
    return found


class Hold:
    """The exclusive side kept past a first call until its backward ran (or WAIT passed)."""

    def __init__(self, me: int) -> None:
        self.me = me
        self.done = False
        self.queued = False
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._timer = threading.Thread(target=self._watch, name="gpuops-guard-hold", daemon=True)

    def arm(self, nodes: List[Any]) -> None:
        for node in nodes:
            node.register_hook(self._ran)
        counts.COUNTS.backward_holds += 1
        self._timer.start()

    def _watch(self) -> None:
        """Released after WAIT, or at once when the first call's thread cannot run the backward: it ended,
        or waits idle in threading/queue (forwards in threads, backward in the main thread: the
        `parallel_apply` shape, where holding would make every new signature wait out WAIT)."""
        deadline = time.monotonic() + WAIT
        while not self._ended.wait(min(LOOK_EVERY, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                self.release(True)
                return
            if not _may_run_backward(self.me):
                self.release()
                return

    def _ran(self, *_: Any) -> None:
        """A compiled node's backward ran: release when the whole backward pass has ended."""
        with self._lock:
            if self.queued or self.done:
                return
            self.queued = True
        engine = getattr(getattr(sys.modules.get("torch.autograd"), "Variable", None), "_execution_engine", None)
        try:
            engine.queue_callback(self.release)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - no engine callback here: release now
            self.release()

    def release(self, timed_out: bool = False) -> None:
        with self._lock:
            if self.done:
                return
            self.done = True
        self._ended.set()
        if timed_out:
            counts.COUNTS.backward_timeouts += 1
        rwlock.release_exclusive(self.me, 0)


_IDLE_FILES = ("threading.py", "queue.py")


def _may_run_backward(ident: int) -> bool:
    """The thread is alive and not waiting idle (its innermost frame in threading or queue: a worker that
    finished its forward and waits for work, or joins)."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return False
    return not frame.f_code.co_filename.endswith(_IDLE_FILES)


def hold_for_backward(me: int, result: Any) -> bool:
    """Keep the exclusive side until the result's backward ran; False (release now) when nothing to wait for."""
    try:
        nodes = compiled_nodes(result)
    except Exception:  # noqa: BLE001 - the guard must never break a training step
        return False
    if not nodes:
        return False
    Hold(me).arm(nodes)
    return True
