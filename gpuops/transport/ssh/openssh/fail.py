"""Why the user's `ssh` failed to connect, read from what it printed (its errors, and the debug lines of the
connecting step), as gpuops' own errors: host keys unknown, changed or revoked, a port that refuses, a name
that does not resolve, a refused login and its cause (agent, certificate, key, second factor). Pure: text in,
error out; the transport decides what to retry."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass

from gpuops.errors import (
    AuthError,
    ChangedHostKey,
    GpuopsError,
    HostKeyError,
    LockedKey,
    RevokedHostKey,
    SshFileError,
    UnknownHostKey,
)


class SshFailed(Exception):
    """ssh could not connect for a reason a retry may cure (or, with `transient` False, will not)."""

    def __init__(self, why: str, *, transient: bool, kind: str = "other") -> None:
        super().__init__(why)
        self.why = why
        self.transient = transient
        self.kind = kind  # refused, resolve, network (this hop's own), closed, other (may be a later hop's echo)
        self.refused = kind == "refused"
        self.label = ""
        self.where = ""


@dataclass(frozen=True)
class HopView:
    """What the messages about one hop need: its inventory name, how known_hosts names it, where its keys are."""

    label: str
    key_name: str  # `host` or `[host]:port`, as known_hosts and ssh's messages name the server
    known_hosts: str  # as the user wrote it (messages)
    identity_file: str | None = None
    identity_agent: str = ""
    certificate_files: tuple[str, ...] = ()
    user: str = ""
    cannot_record: str = ""  # accept-new, but known_hosts cannot take a new key: why


_UNKNOWN = re.compile(r"No (\S+) host key is known for (\S+) and you have requested strict checking")
_CHANGED = re.compile(r"Host key for (\S+) has changed and you have requested strict checking")
_REVOKED = re.compile(r"The (\S+) host key for (\S+) is marked as revoked")
_SERVER_KEY = re.compile(r"Server host key: (\S+) (SHA256:\S+)")
_OFFENDING = re.compile(r"Offending \S+ key in (.+):(\d+)\s*$", re.M)
_RESOLVE = re.compile(r"Could not resolve hostname (\S+?): (.+)")
_CONNECT = re.compile(r"connect to host \S+ port \d+: (.+)")
_DENIED = re.compile(r"Permission denied \(([^)]*)\)")
_AGENT = re.compile(r"get_agent_identities: ssh_get_authentication_socket: (.+)")
_AGENT_LIST = re.compile(r"get_agent_identities: ssh_fetch_identitylist: (.+)")
_ACCEPTED = re.compile(r"Server accepts key: (.+?) (\S+) SHA256:\S+( explicit)?\s*$", re.M)
_OFFERED_CERT = re.compile(r"Offering public key: (.+?) \S+-CERT ")
_SOCKET_LONG = re.compile(r"(ControlPath too long \(.*\)|unix_listener: path .* too long for Unix domain socket)")
_CONFIG = re.compile(r"(Bad owner or permissions on .+|.+: line \d+: Bad configuration option: .+|"
                     r"\S+: terminating, \d+ bad configuration options|Can't open user config file .+)")


def classify(said: str, hop: HopView, *, connect_timeout: float, wait_refused: bool) -> GpuopsError | SshFailed:
    """The error one hop's ssh output means; an SshFailed (with its words) when it is no error of gpuops' tree."""
    return (_host_key(said, hop) or _config(said, hop) or _auth(said, hop)
            or _network(said, connect_timeout, wait_refused) or _other(said))


def _host_key(said: str, hop: HopView) -> GpuopsError | None:
    presented = _SERVER_KEY.search(said)
    key_type, got = presented.groups() if presented else ("", "")
    found = _REVOKED.search(said)
    if found:
        return RevokedHostKey(hop.label, found.group(2), key_type or found.group(1), got or "(fingerprint not known)",
                              hop.known_hosts)
    found = _CHANGED.search(said)
    if found and "REMOTE HOST IDENTIFICATION HAS CHANGED" in said:
        return ChangedHostKey(hop.label, found.group(1), key_type, _recorded(said), got, hop.known_hosts)
    found = _UNKNOWN.search(said)
    if found and hop.cannot_record:
        return SshFileError(hop.label, f"cannot record the new host key of {found.group(2)} in known_hosts "
                            f"{hop.known_hosts} ({hop.cannot_record})", hint=(
                                "make that file (and its folder) writable for the user gpuops runs as, "
                                "or point known_hosts at one it may write"))
    if found:
        return UnknownHostKey(hop.label, found.group(2), key_type or found.group(1), got, hop.known_hosts)
    if "Host key verification failed" in said:
        last = [line for line in said.splitlines() if line and not line.startswith("debug")]
        detail = " ".join(last[-3:]) if last else "Host key verification failed."
        return HostKeyError(hop.label, f"ssh refused the host key of {hop.key_name}: {detail}",
                            hint=f"compare it with known_hosts {hop.known_hosts} (`ssh-keygen -F` shows the entry)")
    return None


def _recorded(said: str) -> str:
    """`ssh-ed25519 SHA256:...` of the key known_hosts holds, read from the line ssh names as offending."""
    found = _OFFENDING.search(said)
    if not found:
        return "another key"
    path, lineno = found.group(1).strip(), int(found.group(2))
    try:
        with open(path, "rb") as fh:
            line = fh.read().decode("utf-8", "replace").splitlines()[lineno - 1]
    except (OSError, IndexError):
        return f"another key ({path}:{lineno})"
    words = line.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    try:
        blob = base64.b64decode(words[2], validate=True)
    except (IndexError, ValueError, binascii.Error):
        return f"another key ({path}:{lineno})"
    return f"{words[1]} " + fingerprint(blob)


def fingerprint(blob: bytes) -> str:
    """SHA256:... of a public key blob, as OpenSSH prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _config(said: str, hop: HopView) -> GpuopsError | None:
    found = _SOCKET_LONG.search(said)
    if found:
        return SshFileError(hop.label, f"ssh cannot use its ControlMaster socket: {found.group(1)}",
                            hint="shorten ControlPath in ~/.ssh/config (`ControlPath ~/.ssh/cm-%C` fits), or remove "
                                 "it: gpuops then keeps its own master")
    found = _CONFIG.search(said)
    if not found:
        return None
    return SshFileError(hop.label, f"ssh refused its configuration: {found.group(1).strip()}",
                        hint="`ssh -G HOST` shows the same; fix that file")


def _auth(said: str, hop: HopView) -> AuthError | None:
    found = _DENIED.search(said)
    if not found:
        return None
    methods = found.group(1)
    denied = f"authentication failed (Permission denied ({methods}))"
    agent = _agent_problem(said, hop)
    certs = list(_OFFERED_CERT.findall(said))
    if "keyboard-interactive" in methods and "publickey" not in methods.split(","):
        return AuthError(hop.label, f"{denied}: the host asks for a password or a second factor, and gpuops never "
                         "prompts", hint="open a ControlMaster yourself first (`ssh -M -fN HOST` with ControlPath in "
                                         "~/.ssh/config): gpuops reuses it where that config checks the host "
                                         "key as the inventory does (docs/security.md)")
    if agent:
        return AuthError(hop.label, f"{denied}: {agent}",
                         hint="start the agent (or the app that provides it) and load the key, or set IdentityAgent "
                              "in ~/.ssh/config to the socket it listens on")
    if certs:
        return AuthError(hop.label, f"{denied}: the host refused the certificate {certs[0]}",
                         hint=f"check its principals ({hop.user or 'the login user'} must be one) and validity "
                              f"with `ssh-keygen -L -f {certs[0]}`, and that the host trusts its CA (TrustedUserCAKeys)")
    locked = _ACCEPTED.search(said)  # the host took the key, yet ssh could not sign with it: a passphrase
    if locked and "-CERT" not in locked.group(2):
        return LockedKey(hop.label, locked.group(1), bool(os.environ.get("SSH_AUTH_SOCK")))
    if hop.identity_file:
        hint = f"check that {hop.identity_file} is authorised for {hop.user or 'the user'} on {hop.key_name}"
    else:
        hint = ("set identity_file in the inventory, load a key into ssh-agent, or configure IdentityFile "
                "(or CertificateFile, IdentityAgent) in ~/.ssh/config")
    return AuthError(hop.label, denied, hint=hint)


def _agent_problem(said: str, hop: HopView) -> str:
    """What was wrong with the agent ssh was told to use, when that is why no key was offered."""
    where = hop.identity_agent or os.environ.get("SSH_AUTH_SOCK", "")
    missing = _AGENT.search(said)
    if missing and where:
        name = f"IdentityAgent {hop.identity_agent}" if hop.identity_agent else f"SSH_AUTH_SOCK {where}"
        return f"no agent answers at {name} ({missing.group(1).strip().lower()})"
    listing = _AGENT_LIST.search(said)
    if listing and "offering public key" not in said.lower():
        return f"the agent would not list its keys ({listing.group(1).strip()})"
    return ""


def _network(said: str, connect_timeout: float, wait_refused: bool) -> SshFailed | None:
    found = _RESOLVE.search(said)
    if found:
        return SshFailed(f"could not resolve hostname {found.group(1)} ({found.group(2).strip()})", transient=False, kind="resolve")
    if "Connection timed out during banner exchange" in said or "banner exchange: Connection to" in said:
        return SshFailed(f"no SSH banner within {connect_timeout:g}s (the port accepts connections, but no SSH "
                         "server answers there)", transient=True, kind="network")
    found = _CONNECT.search(said)
    if found:
        reason = found.group(1).strip()
        if reason == "Connection refused":
            return SshFailed("connection refused", transient=wait_refused, kind="refused")
        if reason == "Connection timed out":
            return SshFailed(f"timed out (no answer within {connect_timeout:g}s)", transient=True, kind="network")
        if reason == "No route to host":
            return SshFailed("no route to host (the host is down or unreachable)", transient=True, kind="network")
        return SshFailed(reason[0].lower() + reason[1:], transient=True, kind="network")
    for words in ("kex_exchange_identification", "Connection reset", "Connection closed by", "Broken pipe"):
        if words in said:
            line = next(x for x in said.splitlines() if words in x)
            return SshFailed(f"the connection closed during the handshake ({line.strip()})", transient=True,
                             kind="closed")
    return None


def _other(said: str) -> SshFailed:
    lines = [x.strip() for x in said.splitlines() if x.strip() and not x.startswith("debug")]
    return SshFailed(lines[-1] if lines else "ssh exited 255 without saying why", transient=False)
