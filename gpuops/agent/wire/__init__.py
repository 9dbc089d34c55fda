"""The wire: everything both sides read. The client imports these modules; the agent writes what they name.

protocol (paths, record names, states, exit codes; re-exports marks and frames), marks (the marker lines
each tool prints, and its one parser), frames (the follower's frames, built and parsed), records (tolerant
reads, atomic writes, the one outcome mapping), watchfile (watch.json, its typed reader and its defaults),
detector_list (the quiet-failure detectors, each declared once), builtin_rules (the built-in rules, each declared
once), smi (nvidia-smi CSV in, values out), masking (secrets out of everything said). Standard library only.
"""
