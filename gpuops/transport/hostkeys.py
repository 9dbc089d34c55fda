"""Host-key checking that fabric leaves out: strict by default, accept-new on request."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from typing import Any

from gpuops.transport._paramiko import paramiko

from gpuops.errors import ChangedHostKey, UnknownHostKey

_append_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """The SHA256 fingerprint as OpenSSH prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse (strict) or record it (accept-new). A changed key never reaches here."""

    def __init__(self, host: str, policy: str, known_hosts: str) -> None:
        self.host = host
        self.policy = policy
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.policy != "accept-new":
            raise UnknownHostKey(self.host, hostname, key.get_name(), fingerprint(key), self.known_hosts)
        record_host_key(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


def record_host_key(path: str, hostname: str, key: paramiko.PKey) -> None:
    """Append one known_hosts line, leaving the rest of the file as it was."""
    path = os.path.expanduser(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
    with _append_lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(line)


def load_known_hosts(client: paramiko.SSHClient, path: str) -> None:
    """Load known_hosts into the client's checked keys (a missing file means none known)."""
    path = os.path.expanduser(path)
    if os.path.exists(path):
        client.get_host_keys().load(path)


def changed_key_error(host: str, exc: Any, known_hosts: str, port: int = 22) -> ChangedHostKey:
    """Map paramiko's BadHostKeyException to our error with both fingerprints.

    paramiko names the host without its port; known_hosts (and `ssh-keygen -R`) use `[host]:port`.
    """
    return ChangedHostKey(
        host,
        exc.hostname if port == 22 else f"[{exc.hostname}]:{port}",
        exc.key.get_name(),
        f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}",
        fingerprint(exc.key),
        known_hosts,
    )
