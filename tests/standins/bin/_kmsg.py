"""The bench's kernel log, shared by the `dmesg` and `journalctl` stand-ins (not a command itself).

The log is the file $GPUOPS_FAKE_KMSG, one record a line: `<seconds since the epoch> <text>` (bench/kmsg.py
appends to it; its records are the driver's lines as tests/bench/kmsg.py quotes them). The host booted at the
time in `$GPUOPS_FAKE_KMSG.boot` (dmesg's `[seconds]` are counted from it). Who may read it, as on a real
Proxmox host: root on the host, and so the host's SSH user here; not a process inside a container
($GPUOPS_FAKE_CT set: an unprivileged container shares the host's kernel but `dmesg` is refused there), and
not at all when the file does not exist (the bench's stand-in for `kernel.dmesg_restrict = 1` with a user
who is not root: tests make it readable with bench.kmsg.KernelLog.enable()).
"""

import os
import time


def path():
    return os.environ.get("GPUOPS_FAKE_KMSG") or ""


def readable():
    """Whether this process may read the kernel log (see the module docstring)."""
    return bool(path()) and not os.environ.get("GPUOPS_FAKE_CT") and os.path.isfile(path())


def boot_time():
    try:
        with open(path() + ".boot") as fh:
            return float(fh.read().strip())
    except (OSError, ValueError):
        return 0.0


def records(offset=0):
    """(t, text) of each complete record from byte `offset`, and the offset after them."""
    try:
        with open(path(), "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out = []
    for raw in data[:end].split(b"\n"):
        stamp, _, text = raw.decode("utf-8", "replace").partition(" ")
        try:
            out.append((float(stamp), text))
        except ValueError:
            continue
    return out, offset + end


def follow(offset, emit, every=0.1):
    """Print the records that come after `offset`, until killed (as `dmesg -w` and `journalctl -f` wait)."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    while True:
        got, offset = records(offset)
        for t, text in got:
            emit(t, text)
        if got:
            sys.stdout.flush()
        time.sleep(every)
