"""Following a run from here: its log's frames through the door (follower.py), read into events, and the
watchdog stood in for when it is gone (viewer.py), with hyperscan's prefilter where it works (accel.py)."""
