"""Playbook files for the config tests: one written from a head and a section, and the error it gives."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuops.config import load_playbook
from gpuops.errors import ConfigError


def write_playbook(tmp_path: Path, head: str, text: str) -> str:
    """`head` (the keys every case needs) then the dedented section under test, as pb.yaml."""
    path = tmp_path / "pb.yaml"
    path.write_text(head + textwrap.dedent(text), encoding="utf-8")
    return str(path)


def playbook_error(path: str) -> str:
    """The message loading the playbook raises, without its FILE: prefix (checked here)."""
    with pytest.raises(ConfigError) as info:
        load_playbook(path, environ={})
    assert str(info.value).startswith(path + ":"), str(info.value)
    return str(info.value)[len(path) + 1 :]
