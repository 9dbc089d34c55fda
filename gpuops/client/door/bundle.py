"""gpuops/agent as the target gets it: a content-hashed copy under ~/.gpuops/lib/<digest>/, made once.

Every target tool is started through a short bootstrap that finds that copy, or says it is
missing (exit NEED_LIB_EXIT); the caller then installs it (one command, the zip on stdin)
and runs the tool again, so the common case costs no extra round trip. User values travel
as arguments ("$@"), never inside the bootstrap's text.
"""

from __future__ import annotations

import hashlib
import os
from functools import cached_property, lru_cache
from typing import Any

from gpuops.agent.wire import marks
from gpuops.agent.wire import protocol as p
from gpuops.command import Cmd, Script, Word

_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "agent")
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)  # fixed, so the same files make the same bytes


class Bundle:
    """The target package as a zip, and the digest that names its folder on the target. Every command
    needs the digest (its bootstrap names the folder); only a copy needs the zip, so it is made then
    (deflating the files is most of the work: 7-8 ms of every `gpuops status` here, for nothing)."""

    def __init__(self, files: list[tuple[str, bytes]]) -> None:
        digest = hashlib.sha256()
        for name, data in files:
            digest.update(name.encode() + b"\0" + data + b"\0")
        self.digest = digest.hexdigest()[:16]
        self._files = files

    @cached_property
    def zip(self) -> bytes:
        import io
        import zipfile

        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in self._files:
                info = zipfile.ZipInfo(f"{p.PACKAGE}/{name}", _ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, data)
        return buf.getvalue()

    @property
    def lib(self) -> str:
        """The folder on the target, as a shell word ($HOME expanded there)."""
        return f'"$HOME/{p.STATE_DIR}/{p.LIB}/{self.digest}"'


@lru_cache(maxsize=1)
def bundle() -> Bundle:
    files = []
    for root, dirs, names in os.walk(_SOURCE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith((".py", ".sh", ".json")):  # .json: data the agent reads (the Xid catalog)
                path = os.path.join(root, name)
                with open(path, "rb") as fh:
                    files.append((os.path.relpath(path, _SOURCE).replace(os.sep, "/"), fh.read()))
    return Bundle(files)


class ToolCmd(Cmd):
    """A command that runs a shipped tool (it finds gpuops' files on the target, or says they are missing)."""


def _boot(b: Bundle) -> list[str]:
    return [f"L={b.lib}", f'[ -d "$L" ] || {{ echo "{marks.mark("need-lib")}"; exit {marks.NEED_LIB_EXIT}; }}']


def python_tool(tool: str, *args: Word) -> Cmd:
    """`python3 -m gpuops_agent TOOL ARGS` from the shipped copy (-E -s: no PYTHON* variables, no user site)."""
    script = Script(*_boot(bundle()), f'cd "$L" && exec python3 -E -s -m {p.PACKAGE} "$@"')
    return ToolCmd("bash", "-c", script, "gpuops", tool, *args)


def shell_tool(name: str, *args: Word) -> Cmd:
    """`bash sh/NAME.sh ARGS` from the shipped copy."""
    script = Script(*_boot(bundle()), f'exec bash "$L/{p.PACKAGE}/sh/{name}.sh" "$@"')
    return ToolCmd("bash", "-c", script, "gpuops", *args)


def install_command() -> Cmd:
    """Unpack the zip given on stdin into the digest's folder (atomically: a temp folder renamed)."""
    b = bundle()
    script = Script(
        f"L={b.lib}",
        '[ -d "$L" ] && exit 0',
        f'mkdir -p "$HOME/{p.STATE_DIR}/{p.LIB}" || exit {marks.CANNOT_CREATE_EXIT}',
        f'T=$(mktemp -d "$L.tmp.XXXXXX") || exit {marks.CANNOT_CREATE_EXIT}',
        'if ! { cat >"$T.zip" && python3 -E -s -m zipfile -e "$T.zip" "$T"; }; then rm -rf "$T" "$T.zip"; '
        f'exit {marks.UNPACK_FAILED_EXIT}; fi',
        'rm -f "$T.zip"',
        '[ -d "$L" ] || mv "$T" "$L"',
        'rm -rf "$T"',
        '[ -d "$L" ]',
    )
    return Cmd("bash", "-c", script)


def with_install(cmd: Cmd) -> Cmd:
    """A shipped tool that takes no stdin, preceded by the copy of gpuops' files (the zip on stdin) in a
    subshell: a first contact in two round trips (the tool saying they are missing, then this), not three.
    A copy that failed leaves the tool's bootstrap saying the files are missing, after the copy's words."""
    shell, flag, script, *args = cmd.argv
    assert isinstance(cmd, ToolCmd) and (shell, flag) == ("bash", "-c") and isinstance(script, Script)
    unpack = install_command().argv[2]
    assert isinstance(unpack, Script)
    return Cmd("bash", "-c", Script("(", *unpack.lines, ")") + script, *args)


def needs_lib(result: Any) -> bool:
    """Whether a tool's result says the shipped copy is missing."""
    return marks.said_need_lib(result.out, result.exit_code)


def install(transport: Any, *, timeout: float, label: str, mask: Any = None) -> None:
    """Copy the target package unless its digest's folder is there already (the zip goes on stdin)."""
    check_installed(transport.run(install_command(), timeout=timeout, stdin=bundle().zip), label=label, mask=mask)


def check_installed(result: Any, *, label: str, mask: Any = None, after: bool = False) -> None:
    """Raise the copy's failure in a user's words (python3 missing, no writable home). `after`: the result
    is a tool's run after the copy (with_install): it failed when the tool still finds no files, and
    its output (stderr merged in) holds the copy's words."""
    from gpuops.errors import RemoteError, TargetNotReady

    if after and not needs_lib(result):
        return
    if not after and result.exit_code == 0:
        return
    err = "\n".join(line for line in (result.err + "\n" + result.out).splitlines()
                    if marks.mark("need-lib") not in line).strip() if after else result.err.strip()
    if "python3" in err and ("not found" in err or "No such file" in err):
        raise TargetNotReady(f"{label}: python3 is not installed on the target (gpuops' watchdog and tools run there)",
                             hint="install python3 there (apt-get install python3)")
    raise RemoteError(f"{label}: could not copy gpuops' target files to ~/{p.STATE_DIR}/{p.LIB} "
                      f"(exit {result.exit_code}): {(mask(err) if mask else err)[-300:] or 'no output'}",
                      hint="the target needs python3, mktemp and a writable home directory")
