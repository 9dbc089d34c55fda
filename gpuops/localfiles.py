"""Files gpuops writes on this machine, where another local user may be waiting for it: private folders that
only the user and root can change (every folder above them checked, as OpenSSH checks the paths of its own
files), and files replaced whole through a temporary made exclusively beside them, never through a name
another user could have planted a link at."""

from __future__ import annotations

import os
import stat
import tempfile

_MAX_LINKS = 40  # symbolic links followed while walking one path (Linux's ELOOP limit)


class UnsafeFolder(Exception):
    """A folder gpuops will not keep private files in; the message says which folder and why."""


def private_folder(path: str) -> str:
    """`path` (absolute), made 0700 where missing, each folder above it one whose entries only this user and
    root can rename or remove (owned by one of them, and not writable by group or others unless sticky with
    the entry below it theirs); the folder itself this user's own real folder, 0700. Else UnsafeFolder."""
    uid = os.getuid()
    try:
        folder, info = _walk(os.path.abspath(path), uid, make=True)
        if info.st_uid != uid:
            raise UnsafeFolder(f"{folder} belongs to {_who(info.st_uid)}, not to the user gpuops runs as")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(folder, 0o700)
    except OSError as exc:
        raise UnsafeFolder(f"cannot use {path}: {exc.strerror or exc}") from None
    return os.path.abspath(path)


def unswappable(path: str) -> str:
    """Why another user could swap the file at `path` (an ssh socket of the user's ControlPath) or serve one
    there, or "": its folder and every folder above pass private_folder's checks without being made, and the
    file, where it exists, is this user's. Nothing is made or changed."""
    uid = os.getuid()
    try:
        folder, info = _walk(os.path.dirname(os.path.abspath(path)), uid, make=False)
        _check_owner(folder, info, uid)
        try:
            entry = os.lstat(path)
        except FileNotFoundError:
            return ""
        if entry.st_uid != uid:
            return f"{path} belongs to {_who(entry.st_uid)}"
        _check_parent(folder, path, entry, uid)
    except UnsafeFolder as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot use {path}: {exc.strerror or exc}"
    return ""


def _walk(path: str, uid: int, *, make: bool) -> tuple[str, os.stat_result]:
    """The real folder `path` names and its lstat, every step checked (and made where missing, with `make`)."""
    parts = _parts(path)
    cur, links = "/", 0
    _check_owner(cur, os.lstat(cur), uid)
    while parts:
        name = parts.pop(0)
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        child = os.path.join(cur, name)
        info = _entry(child) if make else os.lstat(child)
        if stat.S_ISLNK(info.st_mode) and parts:
            _check_parent(cur, child, info, uid)
            links += 1
            if links > _MAX_LINKS:
                raise UnsafeFolder(f"{path}: too many symbolic links")
            target = os.readlink(child)
            cur = "/" if target.startswith("/") else cur
            parts = _parts(target) + parts
            continue
        _check_parent(cur, child, info, uid)
        if not stat.S_ISDIR(info.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
            raise UnsafeFolder(f"{child} is {kind}")
        if parts:
            _check_owner(child, info, uid)
        cur = child
    return cur, os.lstat(cur)


def _parts(path: str) -> list[str]:
    return [name for name in path.split("/") if name not in ("", ".")]


def _entry(path: str) -> os.stat_result:
    """lstat of one step of the walk, the folder made (0700, this user's) where it is missing."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        pass
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:  # made meanwhile (by another gpuops, or by someone else: the checks say)
        pass
    except OSError as exc:
        raise UnsafeFolder(f"cannot make {path}: {exc.strerror or exc}") from None
    return os.lstat(path)


def _check_owner(folder: str, info: os.stat_result, uid: int) -> None:
    """A folder above the private one: its owner is root or this user (anyone else could rename what is in it)."""
    if info.st_uid not in (0, uid):
        raise UnsafeFolder(f"{folder} belongs to {_who(info.st_uid)}, who could swap what gpuops keeps in it")


def _check_parent(folder: str, path: str, entry: os.stat_result, uid: int) -> None:
    """Others may not rename or remove `entry` (at `path`) in `folder`: it is writable by this user and root only,
    or sticky (/tmp) with the entry this user's or root's."""
    info = os.lstat(folder)
    if not info.st_mode & 0o022:
        return
    if info.st_mode & stat.S_ISVTX:
        if entry.st_uid in (0, uid):
            return
        raise UnsafeFolder(f"{path} belongs to {_who(entry.st_uid)}, who could swap what gpuops keeps in it")
    whom = "group and others" if info.st_mode & 0o022 == 0o022 else "its group" if info.st_mode & 0o020 else "others"
    raise UnsafeFolder(f"{folder} is writable by {whom} (mode {stat.S_IMODE(info.st_mode):04o}), who could swap what "
                       "gpuops keeps in it")


def _who(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _umask() -> int:
    """The process's umask, read without changing it (another thread may be making a file meanwhile)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


#: The process's own output streams: written through, never replaced (`--junit /dev/stdout`, `>(cat)`).
_OWN_STREAMS = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/")


def write_whole(path: str, data: bytes) -> None:
    """Replace `path` with `data`, never half a file (a CI upload never takes one): a temporary made exclusively
    in the same folder (mkstemp: O_EXCL, a name nobody can guess, so no link planted there is followed), given
    the mode a new file gets, then renamed over `path` (a link at `path` is replaced, never followed). One of
    this process's own streams, or a named pipe of the user's, is written through instead."""
    if _stream(path):
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_APPEND)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fd = -1
            fh.write(data)
        os.replace(tmp, path)
        tmp = ""
    finally:
        if fd != -1:
            os.close(fd)
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _stream(path: str) -> bool:
    """`path` names one of this process's own descriptors, or is a named pipe owned by the user or root (not a
    link): a stream to write to, where renaming a file over it would replace /dev/stdout itself."""
    if path in _OWN_STREAMS[:2] or path.startswith(_OWN_STREAMS[2:]):
        return True
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISFIFO(info.st_mode) and info.st_uid in (0, os.getuid())
