"""Another user runs every command (Ansible's become): one more prefix around each command, wrapping the
target's transport, so everything above it is the same whoever the job runs as.

In a container `pct exec` already runs as root, so `runuser -u USER --` (util-linux) becomes the user with
no password and no shell in between; on a host reached over ssh (or this machine) `sudo -H -n -u USER --`
(Ansible's default method; -n: gpuops types no password), or `su -s /bin/bash USER -c CMD` (one more
shell layer: the command is rendered, then quoted as one word). runuser, sudo -H and su set HOME, USER and
LOGNAME to the user's, so ~/.gpuops is under that user's home; the rest of the environment stays.
"""

from __future__ import annotations

from typing import Literal

from gpuops.command import Cmd
from gpuops.targets import Target
from gpuops.transport.base import Container, Result, Stream, Transport, Wrapping

Method = Literal["sudo", "su"]


def method_of(target: Target) -> str | None:
    """How the target's job becomes its user: runuser in a container, else sudo or su; None where it needs
    no prefix (no become user, or root in a container, where pct exec already runs as root)."""
    if target.become_user is None:
        return None
    if target.ctid is not None:
        return None if target.become_user == "root" else "runuser"
    return target.become_method


def become_prefix(cmd: Cmd, user: str, method: Method, *, in_container: bool) -> Cmd:
    """`cmd` as `user` runs it: runuser in a container, else sudo or su."""
    if in_container:
        return Cmd("runuser", "-u", user, "--", *cmd.argv)
    if method == "su":
        return Cmd("su", "-s", "/bin/bash", "-c", cmd, user)
    return Cmd("sudo", "-H", "-n", "-u", user, "--", *cmd.argv)


class BecomeTransport(Wrapping):
    """Runs each command through the inner transport as `user` (BecomeTransport(PctTransport(ssh), 'alice'))."""

    def __init__(self, inner: Transport, user: str, method: Method = "sudo") -> None:
        self.inner = inner
        self.user = user
        self.method = method
        self.label = inner.label
        self.container: Container | None = None if inner.container is None else _BecomeContainer(self, inner.container)

    def as_user(self, cmd: Cmd) -> Cmd:
        """The command with the become prefix (the inner transport adds its own, e.g. `pct exec N --`)."""
        return become_prefix(cmd, self.user, self.method, in_container=self.inner.container is not None)

    def wrap(self, cmd: Cmd) -> Cmd:
        return self.inner.wrap(self.as_user(cmd))

    def render(self, cmd: Cmd, *, display: bool = True) -> str:
        return self.inner.render(self.as_user(cmd), display=display)

    def run(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> Result:
        return self.inner.run(self.as_user(cmd), timeout=timeout, stdin=stdin)

    def open(self, cmd: Cmd) -> Stream:
        return self.inner.open(self.as_user(cmd))


class _BecomeContainer:
    """The container's questions, its commands run as the user too (the state is pct's, on the host)."""

    def __init__(self, outer: BecomeTransport, inner: Container) -> None:
        self._outer, self._inner = outer, inner
        self.ctid = inner.ctid

    def run_with_state(self, cmd: Cmd, *, timeout: float, stdin: bytes | None = None) -> tuple[Result, str]:
        return self._inner.run_with_state(self._outer.as_user(cmd), timeout=timeout, stdin=stdin)

    def container_state(self, *, timeout: float) -> str:
        return self._inner.container_state(timeout=timeout)

    def raise_for_container(self, output: str) -> None:
        self._inner.raise_for_container(output)

    @property
    def host(self) -> Transport:
        return self._inner.host

    def from_host(self, cmd: Cmd) -> Cmd:
        return self._inner.from_host(self._outer.as_user(cmd))
