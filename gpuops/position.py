"""Where the user wrote a value: a position in a YAML file, which an error names (FILE:LINE:COL) and the
inventory's and playbook's values carry (yamlpos reads it off the YAML)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mark:
    """A position in a YAML file, 1-based as editors show it."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"
