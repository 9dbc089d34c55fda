"""Where gpuops keeps its ssh files on this machine (its masters' sockets, ssh's logs, a rehomed config): a
private folder that no other local user can swap or serve a socket in. The first of $XDG_RUNTIME_DIR/gpuops/cm,
~/.cache/gpuops/cm, $TMPDIR/gpuops-<uid>/cm that is short enough for a socket and private all the way up
(localfiles.private_folder); where none is, the first private one holds the logs and gpuops makes no master of
its own (each command logs in on its own), and that is said once."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from dataclasses import dataclass

from gpuops.errors import SshFileError
from gpuops.localfiles import UnsafeFolder, private_folder

SOCKET_LIMIT = 104  # sun_path on macOS and the BSDs (108 on Linux): what gpuops' own sockets fit everywhere
SUN_PATH = 108 if sys.platform.startswith("linux") else 104  # this system's: what a path of the user's must fit
SOCKET_SUFFIX = 17  # ssh binds PATH.<16 random characters> first, then renames it to PATH
SOCKET_NAME = 20  # hex digits of the hash that names a master's socket
_said: set[str] = set()


@dataclass(frozen=True)
class ControlDir:
    """gpuops' private folder for ssh's files, and whether its masters' sockets go there."""

    path: str
    sockets: bool
    why: str = ""  # why there is no master of gpuops' own ("" where `sockets`)


def control_dir(label: str) -> ControlDir:
    """The folder (made 0700 where missing); a SshFileError where no candidate is private (exit 2)."""
    room = SOCKET_LIMIT - 1 - SOCKET_SUFFIX - SOCKET_NAME - 1
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    choices = [os.path.join(runtime, "gpuops", "cm")] if runtime and os.path.isdir(runtime) else []
    choices += [os.path.join(os.path.expanduser("~"), ".cache", "gpuops", "cm"),
                os.path.join(tempfile.gettempdir(), f"gpuops-{os.getuid()}", "cm")]
    refused: dict[str, str] = {}
    for folder in choices:
        if len(folder.encode("utf-8", "surrogateescape")) <= room:
            try:
                return ControlDir(private_folder(folder), True)
            except UnsafeFolder as exc:
                refused[folder] = str(exc)
    why = ("; ".join(f"not {folder}: {reason}" for folder, reason in refused.items()) if refused else
           f"no folder for its socket is short enough ({', '.join(choices)}: a socket's path fits "
           f"{SOCKET_LIMIT} bytes)")
    for folder in choices:
        if folder in refused:
            continue
        try:
            return ControlDir(private_folder(folder), False, why)
        except UnsafeFolder as exc:
            refused[folder] = str(exc)
    raise SshFileError(label, "no private folder for ssh's files: " + "; ".join(refused.values()),
                       hint="set XDG_RUNTIME_DIR to a folder of your own (mode 0700)")


def say_no_master(label: str, dirs: ControlDir) -> None:
    """Why the commands to a host make a login each, once per process: the CLI shows it on stderr (not under -q),
    as it shows connect retries."""
    message = (f"{label}: no ControlMaster of gpuops' own ({dirs.why}); each command logs in on its own (set "
               "XDG_RUNTIME_DIR to a short private folder to keep one)")
    if message not in _said:
        _said.add(message)
        logging.getLogger("gpuops.transport.connect").warning("%s", message)
