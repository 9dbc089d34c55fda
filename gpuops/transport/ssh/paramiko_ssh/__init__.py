"""Paramiko carries the connection where there is no `ssh` (paramiko_transport.py): the hops connected one
through another (chain.py), known hosts checked as ssh checks them (hostkeys.py), a socket that sends at once
(lowlatency.py)."""
