"""The wire: everything both sides read. The client imports these modules; the agent writes what they name.

protocol (paths, record names, states; re-exports exits, marks and frames), exits (the contract's exit codes), marks (the marker lines
each tool prints, and its one parser), frames (the follower's frames, built and parsed), records (tolerant
reads, atomic writes, the one outcome mapping), watchfile (watch.json and its defaults), smi (nvidia-smi CSV
in, values out), masking (secrets out of everything said). Standard library only.
"""
