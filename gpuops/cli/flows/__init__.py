"""What the commands share: driving the client's events to a render, one target or several (run_flow.py, with
fanout.py: a process per target), a torchrun job's launch and follow (job_flow.py), which run a command acts
on (which_run.py) and what a launch would send without sending it (dry_run.py)."""
