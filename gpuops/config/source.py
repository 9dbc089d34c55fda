"""An inventory file as the format plugins see it: its text read once, its YAML parsed at most once."""

from __future__ import annotations

from gpuops.config.yamlpos import Mapping, Node, Scalar, load, read_text
from gpuops.errors import ConfigError

YAML_SUFFIXES = (".yml", ".yaml", ".json")


class Source:
    """What each plugin's accepts() judges and load() reads: the path, the text, the YAML (if it is YAML)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.text = read_text(path)  # a missing or non-UTF-8 file: the same error for every format
        self.yaml_named = path.lower().endswith(YAML_SUFFIXES)
        self._parsed = False
        self._root: Node | None = None
        self._error: ConfigError | None = None

    def parses(self) -> bool:
        """Whether the file is YAML; the parse error is kept for a file that is named as YAML."""
        if not self._parsed:
            self._parsed = True
            try:
                self._root = load(self.path, vault=True)  # gpuops' own format refuses it (inventory.load)
            except ConfigError as exc:
                self._error = exc
        return self._error is None

    @property
    def root(self) -> Node | None:
        """The parsed YAML (None for an empty file); raises its parse error when it is not YAML."""
        if not self.parses():
            assert self._error is not None
            raise self._error
        return self._root

    def top_keys(self) -> set[str]:
        """The keys of a top-level mapping (empty for anything else)."""
        root = self.root if self.parses() else None
        if not isinstance(root, Mapping):
            return set()
        return {k.text for k, _ in root.pairs if isinstance(k, Scalar)}

    def rejection(self) -> ConfigError | None:
        """Why no plugin accepted it: the YAML error of a file named .yml/.yaml/.json that does not parse."""
        self.parses()
        return self._error
