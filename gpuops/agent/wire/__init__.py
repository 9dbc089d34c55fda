"""The wire: everything both sides read, and the one surface they share. The client imports these modules
and no other module of the agent; the agent writes what they name and runs what both sides run.

protocol (paths, record names, states; re-exports exits, marks and frames), exits (the contract's exit codes),
marks (the marker lines each tool prints, and each tool's one reply type and parser), frames (the follower's
frames, built here and read back as values), runinfo (a run as its records say it: its state, its exit code),
records (tolerant reads, atomic writes, the one outcome mapping), watchfile (watch.json, its typed reader and
its defaults), detector_list (the quiet-failure detectors, each declared once), channel_list (the
notification channel kinds, each declared once), builtin_rules (the built-in rules, each declared once),
ruleset (watch.json's rules as a matcher), signatures/ (the fatal-signature matcher and its rule kinds), stall
(the stall clock), samples (the GPU samples' line format), smi (nvidia-smi CSV in, values out), masking
(secrets out of everything said), hookurl (a webhook URL as the sender posts to it), jobwire (a torchrun job's
store values), stackfile (the stack files' names). Standard library only.
"""
