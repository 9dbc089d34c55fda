"""The TCP socket under an SSH connection, tuned for short request/response exchanges.

gpuops talks to sshd in small messages that each wait for an answer (key exchange, auth,
channel open, exec). Two TCP defaults turn that into 40 ms stalls: Nagle's algorithm holds
our next small message until the previous one is acknowledged, and delayed ACKs hold our
acknowledgement of the server's small messages, so the server's own Nagle holds its next
reply (after auth, sshd sends an unanswered `hostkeys-00@openssh.com` notice, and the
channel-open confirmation behind it waits for our ACK). Measured on the bench (OpenSSH 9.2):
connect 66 -> 22 ms, first channel open 42 -> 1.4 ms.

TCP_NODELAY is set once. TCP_QUICKACK is not sticky on Linux (the kernel goes back to delayed
ACKs when traffic looks interactive), so it is set again after every read; where the platform
has no TCP_QUICKACK only TCP_NODELAY applies.
"""

from __future__ import annotations

import socket
from typing import Any

_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


class LowLatencySocket:
    """Wraps a connected TCP socket; everything but recv() goes straight to it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._quickack = _QUICKACK
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # not TCP after all (a Unix socket from a test harness): nothing to tune
            self._quickack = None
        self._ack_now()

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        self._ack_now()
        return data

    def _ack_now(self) -> None:
        if self._quickack is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, self._quickack, 1)
            except OSError:
                self._quickack = None  # refused once: it will be refused again

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def transport_factory(sock: Any, **kwargs: Any) -> Any:
    """For paramiko's SSHClient.connect(transport_factory=): a Transport over a tuned socket.
    A jump host's channel (not a socket) is passed through: the jump's own socket is tuned."""
    from gpuops.transport.ssh._paramiko import paramiko

    tcp = isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6)
    if tcp and sock.type == socket.SOCK_STREAM:
        sock = LowLatencySocket(sock)
    return paramiko.Transport(sock, **kwargs)
