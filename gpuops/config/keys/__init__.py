"""The playbook's keys, one module per section (its reader: each bad value a FILE:LINE:COL error): watch
(watch.py; its detectors' keys from the wire's list, detector_keys.py; watch.metrics, metrics_keys.py),
restart (restart_keys.py), notify (notify_keys.py: each channel kind's keys from the wire's list) and the
torchrun job's launch.nodes and torchrun (torchrun_keys.py). config/playbook.py reads a playbook through them."""
