"""A launch, step by step: preflight and the launch lock (preflight.py, with its GPU checks in gpus.py), the
warmups (sequential_warmup.py), the run's id (run_id.py) and the launch itself (launch.py: also `stop`), a
torchrun job's launch over its nodes (nodes_launch.py), and what a Ctrl-C may not cut short (uninterruptible.py)."""
