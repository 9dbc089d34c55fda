"""Faults a test injects on the bench: a tmux that fails, a full disk (a tiny tmpfs), and the
container's PATH that puts such wrappers first. Each undoes itself (context managers)."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

from bench import BENCH_PATH


def container_path(fake, bindir: Path, vmid: int = 200) -> None:
    """The container's PATH: `bindir` first, then the bench's."""
    fake.set_env(vmid, PATH=f"{bindir}:{BENCH_PATH}")


def tmux_wrapper(bindir: Path, flag: Path, count: Path, *, stderr: str, code: int = 1, hang: float = 0,
                 commands: tuple[str, ...] = ("has-session",)) -> Path:
    """A `tmux` earlier on PATH: while `flag` exists, `commands` fail as a broken tmux does
    (`stderr`, exit `code`, or hangs `hang` seconds), one line appended to `count` per has-session;
    anything else, and everything once `flag` is gone, is the real tmux."""
    real = shutil.which("tmux", path=BENCH_PATH)
    assert real, "no tmux on the bench"
    bindir.mkdir(parents=True, exist_ok=True)
    script = bindir / "tmux"
    names = " ".join(commands)
    script.write_text(
        "#!/bin/bash\n"
        f'if [[ " {names} " == *" $1 "* ]] && [ -e {shlex.quote(str(flag))} ]; then\n'
        f'  [ "$1" = has-session ] && echo call >>{shlex.quote(str(count))}\n'
        + (f"  sleep {hang:g}\n" if hang else "")
        + f"  echo {shlex.quote(stderr)} >&2; exit {code}\n"
        "fi\n"
        f'exec {shlex.quote(real)} "$@"\n')
    script.chmod(0o755)
    return script


def calls(count: Path) -> int:
    try:
        return len(count.read_text().splitlines())
    except OSError:
        return 0


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "16m") -> Iterator[Path]:
    """A small tmpfs mounted at `path` (made if missing) for the block; lazily unmounted after it."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def full_disk(folder: Path) -> Iterator[Path]:
    """Fill the filesystem holding `folder` to the last byte for the block; the space comes back after."""
    filler = folder / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        size = 1 << 16
        while size:
            try:
                os.write(fd, b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size //= 2
    finally:
        os.close(fd)
    try:
        yield filler
    finally:
        with contextlib.suppress(OSError):
            os.unlink(filler)


def can_mount() -> bool:
    """Root with mount(8): the tmpfs faults can run here."""
    return os.geteuid() == 0 and shutil.which("mount") is not None
