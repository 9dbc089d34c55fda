"""The user's own `ssh` carries the connection (openssh.py): its command line planned (argv.py), its failures
read (fail.py), its ControlMaster sockets' folder (dirs.py)."""
