"""The SSH family: a host reached with the user's `ssh` (openssh/) or with paramiko where there is none
(paramiko_ssh/); shared by both: the hop plan as ssh resolves it (resolve.py, plan.py), how a connection is
made and retried (connecting.py, head_start.py) and paramiko, imported only when used (_paramiko.py).
Nothing is imported here: each transport imports only what it uses."""
