"""Shell commands as values: user data is quoted once per shell layer, at render time.

A `Cmd` is an argv; each piece is a literal word (quoted when rendered), a `Secret`
(quoted, or shown as *** when rendered for display) or `Raw` shell syntax written by
gpuops itself (never user data). A `Script` is lines of commands for `bash -c`; used
as a word inside another command it is rendered, then quoted as one word: that is
the next shell layer.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Union

from gpuops.agent.wire.masking import MASK

#: For display: masks secrets a user spelled out inside a word, before the word is quoted
#: (quoting changes the spelling of a value holding ', so masking after it would miss it).
Mask = Optional[Callable[[str], str]]


@dataclass(frozen=True)
class Secret:
    """A word whose value must never be shown."""

    value: str

    def __repr__(self) -> str:
        return "Secret(***)"


@dataclass(frozen=True)
class Raw:
    """Shell syntax written by gpuops (operators, redirections, $VAR): rendered as is."""

    text: str


@dataclass(frozen=True)
class Assign:
    """`NAME=value` as one shell word: the name is checked, the value quoted."""

    name: str
    value: Union[str, Secret]

    def __post_init__(self) -> None:
        if not (self.name.isascii() and self.name.isidentifier()):
            raise ValueError(f"not a shell variable name: {self.name!r}")


Word = Union[str, Secret, Raw, Assign, "Cmd", "Script"]


def _render_word(word: Word, display: bool, mask: Mask) -> str:
    if isinstance(word, Raw):
        return word.text
    if isinstance(word, Secret):
        return MASK if display else shlex.quote(word.value)
    if isinstance(word, Assign):
        return f"{word.name}=" + _render_word(word.value, display, mask)
    if isinstance(word, (Cmd, Script)):
        return shlex.quote(word.render(display=display, mask=mask))
    text = str(word)
    return shlex.quote(mask(text) if display and mask else text)


@dataclass(frozen=True)
class Cmd:
    """An argv; rendering quotes each word for one shell layer."""

    argv: tuple[Word, ...]

    def __init__(self, *argv: Word) -> None:
        object.__setattr__(self, "argv", tuple(argv))

    def render(self, *, display: bool = False, mask: Mask = None) -> str:
        return " ".join(_render_word(w, display, mask) for w in self.argv)

    def words(self) -> list[str]:
        """The argv as strings, for exec without a shell (secrets included)."""
        out: list[str] = []
        for w in self.argv:
            if isinstance(w, (Raw, Assign)):
                raise ValueError("a command with shell syntax cannot be executed without a shell")
            if isinstance(w, Secret):
                out.append(w.value)
            elif isinstance(w, (Cmd, Script)):
                out.append(w.render())
            else:
                out.append(str(w))
        return out

    def __add__(self, other: Iterable[Word]) -> "Cmd":
        return Cmd(*self.argv, *other)


Line = Union[Cmd, Raw, str]


@dataclass(frozen=True)
class Script:
    """Lines of shell for `bash -c`; plain strings are trusted shell written by gpuops."""

    lines: tuple[Line, ...]

    def __init__(self, *lines: Line) -> None:
        object.__setattr__(self, "lines", tuple(lines))

    def render(self, *, display: bool = False, mask: Mask = None) -> str:
        return "\n".join(
            line.render(display=display, mask=mask) if isinstance(line, Cmd)
            else (line.text if isinstance(line, Raw) else line)
            for line in self.lines
        )

    def __add__(self, other: "Script") -> "Script":
        return Script(*self.lines, *other.lines)


def bash(script: Script) -> Cmd:
    """`bash -c <script>`: the innermost shell layer on every target."""
    return Cmd("bash", "-c", script)


def export(name: str, value: str | Secret) -> Cmd:
    """`export NAME=value` with the value quoted; the name must be a shell identifier."""
    return Cmd(Raw("export"), Assign(name, value))
