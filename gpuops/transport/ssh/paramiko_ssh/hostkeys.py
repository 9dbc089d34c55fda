"""Host-key checking that fabric leaves out: strict by default, accept-new on request."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import threading
from typing import Any

from gpuops.errors import ChangedHostKey, HostKeyError, RevokedHostKey, SshFileError, UnknownHostKey, os_reason
from gpuops.transport.ssh._paramiko import paramiko
from gpuops.transport.ssh.plan import known_hosts_name
from gpuops.transport.ssh.plan import read_known_hosts as _read_known_hosts

_append_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """The SHA256 fingerprint as OpenSSH prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown key: refuse (strict) or record it (accept-new). A changed key never reaches here."""

    def __init__(self, host: str, policy: str, known_hosts: str, revoked: frozenset[str] = frozenset()) -> None:
        self.host = host
        self.policy = policy
        self.known_hosts = known_hosts
        self.revoked = revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if key.get_base64() in self.revoked:
            raise RevokedHostKey(self.host, hostname, key.get_name(), fingerprint(key), self.known_hosts)
        if self.policy != "accept-new":
            raise UnknownHostKey(self.host, hostname, key.get_name(), fingerprint(key), self.known_hosts)
        try:
            record_host_key(self.known_hosts, hostname, key)
        except OSError as exc:
            where = f"in known_hosts {self.known_hosts} ({os_reason(exc)})"
            raise SshFileError(self.host, f"cannot record the new host key of {hostname} {where}", hint=(
                "make that file (and its folder) writable for the user gpuops runs as, "
                "or point known_hosts at one it may write")) from None
        client.get_host_keys().add(hostname, key.get_name(), key)


def record_host_key(path: str, hostname: str, key: paramiko.PKey) -> None:
    """Append one known_hosts line, leaving the rest of the file as it was, byte for byte; a last line
    without its newline gets one first, or the new entry would be glued onto it (OpenSSH rejects that)."""
    path = os.path.expanduser(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    line = f"{hostname} {key.get_name()} {key.get_base64()}\n".encode()
    with _append_lock:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            os.write(fd, line)
        finally:
            os.close(fd)


def load_known_hosts(client: paramiko.SSHClient, path: str, hostname: str, port: int, *,
                     label: str = "") -> frozenset[str]:
    """Load the known_hosts entries that can name this server into the client's checked keys
    (a missing file means none known); return the keys (base64) that `@revoked` lines revoke
    for it, which are left out of the checked keys (HostKeyPolicy then refuses them).

    paramiko's HostKeys.load parses every line and checks each new entry against all before it:
    40 ms for 360 lines, 0.5 s for 1,080 here, on every connection and every jump hop. paramiko
    matches a server only by a host field equal to its name or hashed from it (no patterns), so
    only those lines are parsed, in file order, the first key of a type winning as in load():
    the same keys, the same verdicts (a changed key is still found and refused). load() dies on
    marker lines and bad base64; here `@revoked` lines are honoured as OpenSSH does (their host
    field is a pattern list: `*`, `?`, `!`), `@cert-authority` lines (host certificates, which
    paramiko does not support) and unreadable lines are skipped, as OpenSSH skips the latter.
    The file is read as bytes: names and keys are ASCII, a comment may be in any encoding."""
    text = _read_known_hosts(path, label or known_hosts_name(hostname, port))
    if text is None:
        return frozenset()
    name = known_hosts_name(hostname, port)
    entries: list[Any] = []
    revoked: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] == "#":
            continue
        marker = None
        if line[0] == "@":
            marker, _, line = line.partition(" ")
            line = line.lstrip(" \t")
            if marker != "@revoked":
                continue
        field = re.split(" |\t", line, maxsplit=1)[0]
        if marker is None and not any(_names(h, name) for h in field.split(",")):
            continue
        if marker is not None and not _patterns_match(field, name):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError):
            continue  # an unknown key type, bad base64 or a non-ASCII byte in the key: OpenSSH skips the line too
        if entry is None:
            continue
        if marker is None:
            entries.append(entry)
        else:
            revoked.add(entry.key.get_base64())
    keys = client.get_host_keys()
    for entry in entries:
        if entry.key.get_base64() in revoked:
            continue
        for h in entry.hostnames:
            known = keys.lookup(h)
            if known is None or entry.key.get_name() not in known:
                keys.add(h, entry.key.get_name(), entry.key)
    return frozenset(revoked)


def _names(field: str, name: str) -> bool:
    """Whether a known_hosts host field names the server, plainly or hashed (|1|salt|hash)."""
    if field == name:
        return True
    if field.startswith("|1|"):
        try:
            return hmac.compare_digest(paramiko.HostKeys.hash_host(name, field), field)
        except (ValueError, TypeError, AssertionError, binascii.Error):  # a malformed hash names nobody (paramiko asserts the salt's length)
            return False
    return False


def _patterns_match(field: str, name: str) -> bool:
    """OpenSSH's host pattern list: any pattern matches and no negated one does (case-insensitive)."""
    matched = False
    for pattern in field.split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        wildcard = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
        if _names(pattern, name) or re.fullmatch(wildcard, name, re.IGNORECASE | re.DOTALL):
            if negated:
                return False
            matched = True
    return matched


def bad_key_error(host: str, exc: Any, known_hosts: str, port: int, revoked: frozenset[str]) -> HostKeyError:
    """paramiko's BadHostKeyException (a key other than the recorded one) as our error."""
    if exc.key.get_base64() in revoked:
        return RevokedHostKey(host, known_hosts_name(exc.hostname, port), exc.key.get_name(), fingerprint(exc.key), known_hosts)
    return changed_key_error(host, exc, known_hosts, port)


def changed_key_error(host: str, exc: Any, known_hosts: str, port: int = 22) -> ChangedHostKey:
    """Map paramiko's BadHostKeyException to our error with both fingerprints.

    paramiko names the host without its port; known_hosts (and `ssh-keygen -R`) use `[host]:port`.
    """
    return ChangedHostKey(
        host,
        known_hosts_name(exc.hostname, port),
        exc.key.get_name(),
        f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}",
        fingerprint(exc.key),
        known_hosts,
    )
