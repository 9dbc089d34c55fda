"""Inventories and playbooks: YAML files -> validated dataclasses, with FILE:LINE:COL errors.

PyYAML is imported only when a file is loaded, so importing this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol

from gpuops.config.inventory import resolve_target
from gpuops.config.source import Source
from gpuops.targets import Host, Inventory, Target

if TYPE_CHECKING:  # the playbook's model is imported where a playbook is read
    from gpuops.config.playbook_model import Playbook


class InventoryFormat(Protocol):
    """An inventory format plugin (a module): whether it reads this file, and reading it."""

    def accepts(self, source: Source) -> bool: ...

    def load(self, source: Source) -> Inventory: ...


FORMATS = ("gpuops.config.ansible.listjson", "gpuops.config.ansible.yamlfile", "gpuops.config.inventory",
           "gpuops.config.ansible.ini")


def formats() -> Iterator[InventoryFormat]:
    """The formats in the order they are asked: `ansible-inventory --list` JSON, Ansible YAML (groups at the
    top), gpuops' own, Ansible INI; each imported when its turn comes (a YAML file never imports INI's)."""
    import importlib

    for name in FORMATS:
        yield importlib.import_module(name)  # a module is the plugin


def load_inventory(path: str) -> Inventory:
    """Read and validate an inventory file: the first format that accepts it loads it, the way Ansible's
    inventory manager asks its plugins; a .yml/.yaml/.json file that no format takes is a YAML error.
    A directory is an Ansible inventory directory: its files merged as Ansible merges them."""
    import os

    if os.path.isdir(path):
        from gpuops.config.ansible import directory

        return directory.load(path)
    source = Source(path)
    for fmt in formats():
        if fmt.accepts(source):
            return fmt.load(source)
    error = source.rejection()
    assert error is not None  # INI takes every file not named as YAML, gpuops every named one that parses
    raise error


def load_playbook(path: str, **kwargs: Any) -> Playbook:
    """Load and validate a playbook (see gpuops.config.playbook; imported only when a playbook is read)."""
    from gpuops.config.playbook import load_playbook as _load

    return _load(path, **kwargs)

__all__ = ["Host", "Inventory", "Target", "load_inventory", "load_playbook", "resolve_target"]
