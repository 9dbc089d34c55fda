"""gpuops' entry in the job's Python processes: this folder is first on the PYTHONPATH of every run's warmup
and training (sh/common.sh pythonpath_env), so Python's ``site`` imports this file at start-up in each.

It loads the agent package beside it under a private name (nothing is added to sys.path), registers
gpuops' faulthandler for the run's stacks (guard/stackdump.py; where watch.stacks is not off), in a rank of
a torchrun job starts the Flight Recorder helper (guard/flight_helper.py: a thread that waits on a FIFO) and
makes the job's collective timeout the process group's default (guard/pg_timeout.py), installs the compile
guard's import hook with ``launch.compile_guard`` (GPUOPS_COMPILE_GUARD=1), then runs the ``sitecustomize``
this one hides, if the environment has one further down sys.path. Nothing here imports torch.
"""

import os
import sys


def _agent_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(module: str):
    """Import <lib>/gpuops_agent as the private package _gpuops_agent, then one of its modules."""
    import importlib.util

    root = _agent_dir()
    name = "_gpuops_agent"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, "__init__.py"),
                                                      submodule_search_locations=[root])
        if spec is None or spec.loader is None:  # a file location always has both
            raise ImportError("gpuops: cannot load the agent package from " + root)
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        spec.loader.exec_module(package)
    return importlib.import_module(name + "." + module)


def _chain() -> None:
    """Run the sitecustomize this file hides (the first one on sys.path after this folder)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.py does for its own sitecustomize: say so, go on
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s\n"
                             % (exc.__class__.__name__, exc))


if __name__ == "sitecustomize":
    if os.environ.get("GPUOPS_RUN_DIR"):
        try:
            _load("guard.stackdump").install()
        except Exception as exc:  # stacks must never stop the training from starting
            sys.stderr.write("gpuops stacks: faulthandler not registered: %s: %s\n" % (exc.__class__.__name__, exc))
    if os.environ.get("GPUOPS_RUN_DIR") and os.environ.get("RANK"):  # a rank that torchrun started in a gpuops job
        for _part in ("guard.flight_helper", "guard.pg_timeout"):
            try:
                _load(_part).install()
            except Exception as exc:  # the job's helpers must never stop the training from starting
                sys.stderr.write("gpuops %s: not installed: %s: %s\n" % (_part, exc.__class__.__name__, exc))
    if os.environ.get("GPUOPS_COMPILE_GUARD") == "1":
        try:
            _load("guard.importhook").install()
        except Exception as exc:  # the guard must never stop the training from starting
            sys.stderr.write("gpuops compile guard: not installed: %s: %s\n" % (exc.__class__.__name__, exc))
    _chain()
