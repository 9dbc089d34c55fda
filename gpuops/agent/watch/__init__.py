"""Watching a run from beside it: the watchdog (log -> matcher -> stall clock -> detectors -> the one abort),
its supervisor, its heartbeat and events, the log read by offset, the follower
that streams frames to a client, and the rules a run was launched with (ruleset).

Target side, except `stall` and `ruleset`, which a following client also uses when it takes over watching.
"""
