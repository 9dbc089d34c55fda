"""The compile guard: what a training process loads (through pythonpath/sitecustomize.py) so that
its ``torch.compile``d objects never compile while another thread runs or compiles one.

Standard library only, plus the ``torch`` the process imports itself; the folder ``pythonpath/``
is what ``launch.compile_guard`` puts first on the job's PYTHONPATH (docs/compile-guard.md).
Nothing here runs when this package is imported: ``importhook.install`` does the work.
"""
