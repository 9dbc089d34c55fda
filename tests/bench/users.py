"""A second local user of this machine, the attacker of issue 35's tests (a folder it made in a shared /tmp, a
link it planted there): added with useradd for the tests that need one, removed with userdel after. Where users
cannot be added (not root, no useradd, a read-only /etc) `OtherUser.create()` raises UsersUnavailable, saying
why, and those tests skip with it. A shared folder (1777, as /tmp) is where it acts: `shared_folder()`."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.waiting import wait_until


class UsersUnavailable(Exception):
    """Why no second user can be made here."""


class OtherUser:
    """A user with no home and no login shell; `run()` runs a command as it (its own uid, gid, no other groups)."""

    def __init__(self, name: str, uid: int, gid: int) -> None:
        self.name, self.uid, self.gid = name, uid, gid

    @classmethod
    def create(cls) -> "OtherUser":
        if os.geteuid() != 0:
            raise UsersUnavailable("adding a second local user needs root")
        useradd = shutil.which("useradd")
        if useradd is None:
            raise UsersUnavailable("no useradd on this machine")
        name = f"gpo-other-{os.getpid()}"
        said = ""
        for _ in range(20):  # another process may hold /etc/passwd's lock for a moment
            done = subprocess.run([useradd, "-M", "-U", "-s", "/usr/sbin/nologin", "-d", "/nonexistent", name],
                                  capture_output=True, text=True, timeout=60)
            if done.returncode == 0:
                entry = pwd.getpwnam(name)
                return cls(name, entry.pw_uid, entry.pw_gid)
            said = done.stderr.strip()
            if "lock" not in said:
                break
            time.sleep(0.5)
        raise UsersUnavailable(f"useradd {name} failed: {said}")

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """`argv` as this user, from /; its failure fails the test."""
        return subprocess.run(argv, user=self.uid, group=self.gid, extra_groups=[], cwd="/", capture_output=True,
                              text=True, timeout=60, check=True, env={"PATH": "/usr/bin:/bin", "HOME": "/"})

    def start(self, *argv: str) -> subprocess.Popen[str]:
        """`argv` as this user, in the background (its stdout a pipe); the caller ends it."""
        return subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[], cwd="/", stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, env={"PATH": "/usr/bin:/bin", "HOME": "/"})

    def remove(self) -> None:
        """userdel (its processes are gone: each run() waited for its own); retried past a held lock."""
        wait_until(lambda: subprocess.run(["userdel", self.name], capture_output=True, timeout=60).returncode in (0, 6),
                   timeout=30, message=f"userdel {self.name}")


def shared_folder() -> Path:
    """A fresh folder under /tmp that every user may write, sticky as /tmp is (mode 1777): the caller removes it."""
    folder = Path(tempfile.mkdtemp(prefix="gpuops-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    return folder
