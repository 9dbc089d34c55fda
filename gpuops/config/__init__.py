"""Inventories and playbooks: YAML files -> validated dataclasses, with FILE:LINE:COL errors.

PyYAML is imported only when a file is loaded, so importing this package stays cheap.
"""

from typing import Any

from gpuops.config.inventory import load_inventory, resolve_target
from gpuops.config.model import Host, Inventory, Playbook, Target


def load_playbook(path: str, **kwargs: Any) -> Playbook:
    """Load and validate a playbook (see gpuops.config.playbook; imported only when a playbook is read)."""
    from gpuops.config.playbook import load_playbook as _load

    return _load(path, **kwargs)

__all__ = ["Host", "Inventory", "Playbook", "Target", "load_inventory", "load_playbook", "resolve_target"]
