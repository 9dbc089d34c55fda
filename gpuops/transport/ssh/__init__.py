"""The SSH family: a host reached with the user's `ssh` (openssh.py: its command line planned in argv.py, its
failures read in fail.py, its sockets' folder in dirs.py) or with paramiko where there is none
(paramiko_transport.py over chain.py, with hostkeys.py and lowlatency.py); shared by both: the hop plan as ssh
resolves it (resolve.py, plan.py) and how a connection is made and retried (connecting.py, head_start.py).
Nothing is imported here: each transport imports only what it uses."""
