"""One error tree for gpuops; the CLI maps each class to its documented exit code."""

from __future__ import annotations

import errno
from typing import Iterable

from gpuops.agent.wire.exits import ExitCode  # noqa: F401  (the contract's codes, defined once in the wire)
from gpuops.position import Mark

#: Worst first (README, "Several targets"). An interrupted command (SIGTERM, Ctrl-C, a closed stdout)
#: did not finish: that wins. Then a bug; then what the runs found, a GPU that failed first (10: the
#: hardware), then the furthest step first (a rule fired, a stall, training failed, warmup, preflight); then reaching the target (3) and the
#: configuration (2); --timeout (124) is a budget, not a finding, so any failure elsewhere outranks it.
SEVERITY = (
    ExitCode.TERMINATED, ExitCode.HANGUP, ExitCode.INTERRUPTED, ExitCode.BROKEN_PIPE, ExitCode.INTERNAL, ExitCode.HARDWARE,
    ExitCode.ABORTED,
    ExitCode.STALLED, ExitCode.TRAINING_FAILED, ExitCode.WARMUP, ExitCode.PREFLIGHT, ExitCode.NOTIFY_FAILED, ExitCode.CONNECT,
    ExitCode.USAGE, ExitCode.TIMEOUT,
)


def severity(code: int) -> int:
    """Higher is worse: 0 is best, an unknown non-zero code just below a bug."""
    if code == ExitCode.OK:
        return 0
    if code in SEVERITY:
        return len(SEVERITY) - SEVERITY.index(code) + 1
    return len(SEVERITY) - SEVERITY.index(ExitCode.INTERNAL)


def worst_exit(codes: Iterable[int]) -> int:
    """The exit code of a command over several targets: the worst of theirs, 0 only when every one succeeded."""
    return max(codes, key=severity, default=ExitCode.OK)


def status_exit(codes: Iterable[int]) -> int:
    """`status` over several targets: the contract's own rule beside worst_exit. A target that could not be
    read makes it 3 (it "exits 3 if any could not be reached"); only a problem every failing target shares
    (a local SSH file: 2) keeps its own code."""
    failed = {c for c in codes if c != ExitCode.OK}
    if not failed:
        return ExitCode.OK
    return worst_exit(failed) if len(failed) == 1 and ExitCode.CONNECT not in failed else ExitCode.CONNECT


class GpuopsError(Exception):
    """Base of every error gpuops reports to a user: a message, an exit code, a hint."""

    exit_code = ExitCode.INTERNAL
    target: str | None = None  # whose error it is, set where it leaves a target's flow (None: no one target's)
    run: str | None = None  # the run it ended, where one had started

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(GpuopsError):
    """A bad option, an unknown target, a missing file."""

    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """A configuration file is malformed; the message reads FILE:LINE:COL: what was expected."""

    def __init__(self, mark: Mark | None, message: str, *, file: str | None = None) -> None:
        where = str(mark) if mark else (file or "<config>")
        super().__init__(f"{where}: {message}")
        self.mark = mark
        self.detail = message


class SshFileError(UsageError):
    """A local file SSH needs (identity_file, known_hosts) is missing or unusable: fix it here, a retry cannot."""

    def __init__(self, host: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{host}: {message}", hint=hint)
        self.host = host


def os_reason(exc: OSError) -> str:
    """Why a local file could not be used, in the words an operator reads ("permission denied")."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return (exc.strerror or str(exc)).lower()


class ConnectError(GpuopsError):
    """The target cannot be reached or authenticated against."""

    exit_code = ExitCode.CONNECT

    def __init__(self, host: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{host}: {message}", hint=hint)
        self.host = host


class AuthError(ConnectError):
    """Authentication was refused: never retried."""


class LockedKey(AuthError):
    """The host would take a key that needs a passphrase nothing supplied (gpuops never prompts)."""

    def __init__(self, host: str, key: str, agent_running: bool) -> None:
        agent = "ssh-agent offered no key the host accepts" if agent_running else \
            "no ssh-agent is running (SSH_AUTH_SOCK is not set)"
        super().__init__(host, f"the key {key} needs a passphrase and {agent}; gpuops never prompts for one",
                         hint=f"load it into the agent gpuops can reach (`ssh-add {key}`), or use a key without a passphrase")


class HostKeyError(ConnectError):
    """A host key problem: never retried, never bypassed."""


class UnknownHostKey(HostKeyError):
    """The host's key is not in known_hosts and the policy is strict."""

    def __init__(self, host: str, key_name: str, key_type: str, fingerprint: str, known_hosts: str) -> None:
        self.key_name = key_name
        self.key_type = key_type
        self.fingerprint = fingerprint
        self.known_hosts = known_hosts
        super().__init__(
            host,
            f"unknown host key for {key_name} ({key_type} {fingerprint}); refusing to connect "
            f"(host_key_policy: strict, known_hosts: {known_hosts})",
            hint=(
                "verify the fingerprint out of band, then trust it with "
                f"`ssh-keyscan {_keyscan_args(key_name)} >> {known_hosts}` "
                "or set `host_key_policy: accept-new` on the host in the inventory"
            ),
        )


class ChangedHostKey(HostKeyError):
    """The host presented a key different from the one recorded: always refused."""

    def __init__(self, host: str, key_name: str, key_type: str, expected: str, got: str, known_hosts: str) -> None:
        self.key_name = key_name
        self.expected = expected
        self.got = got
        super().__init__(
            host,
            f"HOST KEY CHANGED for {key_name}: known_hosts has {expected}, the host presented "
            f"{key_type} {got}; refusing to connect (possible man-in-the-middle)",
            hint=f"if the host was really re-installed, remove the old key with "
            f"`ssh-keygen -R {_quote_host(key_name)} -f {known_hosts}` and connect again",
        )


class RevokedHostKey(HostKeyError):
    """The host presented a key that known_hosts marks @revoked: always refused."""

    def __init__(self, host: str, key_name: str, key_type: str, fingerprint: str, known_hosts: str) -> None:
        self.key_name = key_name
        self.fingerprint = fingerprint
        super().__init__(
            host,
            f"HOST KEY REVOKED for {key_name}: the host presented {key_type} {fingerprint}, which {known_hosts} "
            f"marks @revoked; refusing to connect",
            hint="the key must never be accepted again: ask the host's owner for its new key",
        )


def _quote_host(key_name: str) -> str:
    return f"'{key_name}'" if key_name.startswith("[") else key_name


def _keyscan_args(key_name: str) -> str:
    if key_name.startswith("[") and "]:" in key_name:
        host, port = key_name[1:].split("]:", 1)
        return f"-p {port} {host}"
    return key_name


class RemoteError(GpuopsError):
    """A command on the target failed in a way gpuops did not expect."""

    exit_code = ExitCode.INTERNAL


class CommandTimeout(GpuopsError):
    """A remote command ran past its timeout (treated like a lost connection)."""

    exit_code = ExitCode.CONNECT


class PreflightFailed(GpuopsError):
    """The target is not ready for a run: nothing was changed on it."""

    exit_code = ExitCode.PREFLIGHT


class ContainerNotRunning(PreflightFailed):
    """The LXC container is stopped or missing."""


class RunAlive(PreflightFailed):
    """A run of this playbook, or a launch of it, is already in progress on the target."""


class TargetNotReady(PreflightFailed):
    """The target lacks what a run needs beside it (python3, tmux, a writable ~/.gpuops), or its
    watchdog could not start: nothing was started, no run is left unprotected."""


class WarmupFailed(GpuopsError):
    """A GPU's warmup exited non-zero or timed out; training was not started."""

    exit_code = ExitCode.WARMUP


class RunStopped(GpuopsError):
    """`gpuops stop` ended the run (or the launch in progress) from elsewhere."""

    exit_code = ExitCode.TRAINING_FAILED


class NoRun(UsageError):
    """There is no run of this playbook on the target."""
