"""The target machine as the agent touches it: processes as /proc shows them (procs), tmux sessions by exact
name (tmux), and the wait for a run's files to change (wake: inotify, or a poll where there is none).

The floor every other agent part stands on, beside `wire`; it knows nothing of runs. Standard library only.
"""
