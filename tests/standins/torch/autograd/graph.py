"""Autograd nodes as the compile guard meets them: name(), next_functions, register_hook; and a
backward pass that runs each node (a compiled node compiles its backward the first time), then its
hooks, then the callbacks queued on the engine."""

import threading

_callbacks = None  # the running pass's queued callbacks (one pass at a time is enough here)
_pass_lock = threading.Lock()


class Node:
    def __init__(self, name, next_nodes=(), compile_backward=None):
        self._name = name
        self.next_functions = tuple((n, 0) for n in next_nodes)
        self._compile_backward = compile_backward  # a compiled node: compiles its backward on first use
        self._hooks = []

    def name(self):
        return self._name

    def register_hook(self, fn):
        self._hooks.append(fn)

    def run(self):
        if self._compile_backward is not None:
            self._compile_backward()
        for hook in self._hooks:
            hook((), ())
        for nxt, _ in self.next_functions:
            nxt.run()


def run_backward(root):
    global _callbacks
    with _pass_lock:
        _callbacks = []
        try:
            root.run()
            callbacks = _callbacks
        finally:
            _callbacks = None
    for fn in callbacks:
        fn()
