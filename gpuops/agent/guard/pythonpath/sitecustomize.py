"""The compile guard's entry (gpuops' ``launch.compile_guard``): this folder is first on the job's
PYTHONPATH, so Python's ``site`` imports this file at start-up in every process of the job.

It loads the guard (the agent package beside it, under a private name: nothing is added to
sys.path), installs the import hook, then runs the ``sitecustomize`` this one hides, if the
environment has one further down sys.path. Nothing here imports torch.
"""

import os
import sys


def _agent_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_guard() -> None:
    """Import <lib>/gpuops_agent as the private package _gpuops_agent and install the hook."""
    import importlib.util

    root = _agent_dir()
    name = "_gpuops_agent"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, "__init__.py"),
                                                      submodule_search_locations=[root])
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        spec.loader.exec_module(package)
    importlib.import_module(name + ".guard.importhook").install()


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
    if os.environ.get("GPUOPS_COMPILE_GUARD") == "1":
        try:
            _load_guard()
        except Exception as exc:  # the guard must never stop the training from starting
            sys.stderr.write("gpuops compile guard: not installed: %s: %s\n" % (exc.__class__.__name__, exc))
    _chain()
