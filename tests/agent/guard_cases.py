"""Training-code shapes the compile guard must handle, run by tests/agent/test_guard.py in a fresh process
(PYTHONPATH: the guard's folder, if on, then tests/standins for the stand-in torch; or real torch).
It lives beside the tests, not in tests/standins: a script's own folder is first on sys.path, and
the real-torch test must not find the stand-in there.

    python3 guard_cases.py CASE     prints one JSON line: errors, what ran, the guard's counts

No case changes to suit the guard: each is code as a trainer writes it.
"""

import json
import sys
import threading
import time

import torch

THREADS = 3
DEVICE = "cuda" if getattr(torch, "cuda", None) is not None and torch.cuda.is_available() else "cpu"


def in_threads(work, steps=3):
    """Each of THREADS threads runs work(i) `steps` times, all starting together; the errors they raised."""
    barrier = threading.Barrier(THREADS)
    errors = []

    def run(i):
        barrier.wait()
        try:
            for _ in range(steps):
                work(i)
        except RuntimeError as exc:
            errors.append(str(exc).splitlines()[0])

    threads = [threading.Thread(target=run, args=(i,), name="drafter-%d" % i) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def x(*shape, **kw):
    return torch.randn(*shape, device=DEVICE, **kw)


def step(a, w):
    return a * w + 1


def case_functions():
    """Each thread its own torch.compile(fn), first-called at the same moment."""
    fns = [torch.compile(step) for _ in range(THREADS)]
    return in_threads(lambda i: fns[i](x(4, 32), x(4, 32)))


def case_options():
    """torch.compile(fn, **options), one function shared by the threads."""
    fn = torch.compile(step, mode="reduce-overhead", dynamic=False)
    return in_threads(lambda i: fn(x(4, 32), x(4, 32)))


def case_decorator():
    """@torch.compile on one function, @torch.compile(...) on another, each thread calling both."""
    @torch.compile
    def a(t):
        return t + 1

    @torch.compile(fullgraph=True)
    def b(t):
        return t * 2

    return in_threads(lambda i: b(a(x(8, 8 + i))))


def _linear(n):
    if DEVICE == "cuda":
        return torch.nn.Linear(n, n).to(DEVICE)
    return torch.nn.Linear(n, n)


def case_module():
    """torch.compile(module): each thread its own module; the compiled object stays a Module."""
    mods = [torch.compile(_linear(16)) for _ in range(THREADS)]
    assert all(isinstance(m, torch.nn.Module) for m in mods)
    for m in mods:
        m.train()
    return in_threads(lambda i: mods[i](x(2, 16)))


def case_module_compile():
    """nn.Module.compile(): in place, each thread its own module."""
    mods = [_linear(16) for _ in range(THREADS)]
    for m in mods:
        m.compile()
    return in_threads(lambda i: mods[i](x(2, 16)))


def case_nested():
    """A compiled function calling another compiled function: the inner first call inside the outer
    one, then (thread 0 changing a size the outer one reads) unseen inner signatures inside cached
    outer calls, while the other threads' cached outer calls run."""
    inner = torch.compile(lambda t: t + 1)
    size = [2]

    def outer_fn(t):
        return inner(x(2, size[0])) + t

    outer = torch.compile(outer_fn)

    def work(i):
        if i == 0:
            size[0] += 1
        outer(x(2, 2))

    return in_threads(work, steps=6)


def case_eval():
    """The same compiled function in training and then under no_grad (grad mode is keyed)."""
    fn = torch.compile(step)

    def work(i):
        fn(x(4, 4), x(4, 4))
        with torch.no_grad():
            fn(x(4, 4), x(4, 4))

    return in_threads(work)


def case_flex():
    """The incident's shape (real torch on a GPU only): each thread its own torch.compile(flex_attention),
    forward and backward, bf16, B=1 H=8 S=2048 D=64, a causal block mask; 5 steps each."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 2048, 2048, device="cuda")
    fns = [torch.compile(flex_attention) for _ in range(THREADS)]

    def work(i):
        q, k, v = (torch.randn(1, 8, 2048, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        fns[i](q, k, v, block_mask=mask).sum().backward()
        torch.cuda.synchronize()

    return in_threads(work, steps=5)


def case_train():
    """Each thread its own torch.compile(fn), forward then backward (AOTAutograd compiles the backward
    lazily, at the first .backward(), outside the compiled call)."""
    fns = [torch.compile(step) for _ in range(THREADS)]

    def work(i):
        fns[i](x(4, 32, requires_grad=True), x(4, 32)).sum().backward()

    return in_threads(work)


def case_parallel_apply():
    """Forwards in threads, one per replica, the backward in the main thread (nn.parallel.parallel_apply's
    shape): each step's threads end before the main thread runs the backward."""
    fns = [torch.compile(step) for _ in range(THREADS)]
    errors = []
    for n in range(2):
        outs = [None] * THREADS

        def forward(i, outs=outs, n=n):  # this step's, bound
            try:
                outs[i] = fns[i](x(4, 32 + n, requires_grad=True), x(4, 32 + n))
            except RuntimeError as exc:
                errors.append(str(exc).splitlines()[0])

        threads = [threading.Thread(target=forward, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for out in outs:
            out.sum().backward()
    return errors


def case_ctrl_c():
    """Ctrl-C while the main thread's cached call waits on the shared side (another thread's first call
    compiles): the trainer's `except KeyboardInterrupt` saves its checkpoint."""
    import os
    import signal

    def waits_for_the_lock(frame):
        while frame is not None:
            if frame.f_code.co_name == "shared_slow":  # the guard's wait on the shared side
                return True
            frame = frame.f_back
        return False

    fn = torch.compile(step)
    fn(x(4, 32), x(4, 32))
    main = threading.get_ident()
    compiling = threading.Event()

    def first_call():
        compiling.set()
        fn(x(8, 32), x(8, 32))  # a new signature: the exclusive side, for TORCH_STANDIN_COMPILE_SECONDS

    def interrupt():
        compiling.wait()
        while not waits_for_the_lock(sys._current_frames()[main]):
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=first_call, daemon=True).start()
    threading.Thread(target=interrupt, daemon=True).start()
    try:
        while True:
            fn(x(4, 32), x(4, 32))
    except KeyboardInterrupt:
        return ["checkpoint saved"]


def case_global_state():
    """What the guard cannot see: each thread's compiled function warmed alone, then the default
    dtype changed (global state dynamo guards on): the same arguments, a recompile in every thread."""
    fns = [torch.compile(step) for _ in range(THREADS)]
    for fn in fns:
        fn(x(4, 32), x(4, 32))
    torch.set_default_dtype(torch.float16)
    return in_threads(lambda i: fns[i](x(4, 32), x(4, 32)), steps=1)


def case_nocompile():
    """torch imported, nothing compiled."""
    return []


def main(name):
    errors = globals()["case_" + name]()
    guarded = getattr(torch.compile, "_gpuops_compile_guard", False)
    counts = None
    if guarded:
        counts = sys.modules["_gpuops_agent.guard.counts"].COUNTS.as_record()
    print(json.dumps({"errors": errors, "guarded": guarded, "counts": counts, "torch": torch.__version__}))


if __name__ == "__main__":
    main(sys.argv[1])
