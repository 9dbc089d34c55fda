"""Inventories and playbooks: YAML files -> validated dataclasses, with FILE:LINE:COL errors.

PyYAML is imported only when a file is loaded, so importing this package stays cheap.
"""

from gpuops.config.inventory import load_inventory, resolve_target
from gpuops.config.model import Host, Inventory, Playbook, Target
from gpuops.config.playbook import load_playbook

__all__ = ["Host", "Inventory", "Playbook", "Target", "load_inventory", "load_playbook", "resolve_target"]
