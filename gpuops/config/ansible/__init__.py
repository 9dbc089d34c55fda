"""Ansible inventories (YAML or INI) read as gpuops inventories: each Ansible host becomes a target.

tree: groups, hosts and Var (a variable, read through schema.py's checks); yamlfile and ini: the two
format plugins; layers: variables layered as Ansible does; hosts and sshargs: a host's ssh settings
from the ansible_* variables and ProxyJump / -J (or the `ssh -W %h:%p` ProxyCommand); become_vars:
who runs the job (ansible_become*); build: the result.
"""
