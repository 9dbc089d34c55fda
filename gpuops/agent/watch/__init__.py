"""Watching a run from beside it: the watchdog (log -> matcher -> stall clock -> detectors -> the one abort),
its supervisor, its heartbeat and events, the log read by offset, the job link of a torchrun job's node, and
the follower that streams frames to a client. Target side only: what a viewing client also runs (the rules a
run was launched with, the matcher, the stall clock) is the wire's (wire/ruleset.py, wire/signatures/,
wire/stall.py).
"""
