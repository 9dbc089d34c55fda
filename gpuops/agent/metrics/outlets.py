"""Where a run's exposition goes from the watchdog: node_exporter's textfile collector and the Pushgateway.

Each place is an Outlet: a thread of its own takes the newest text offered and delivers it; offering never
waits, so a place that is unwritable, full or slow (a dead NFS mount that blocks a write for ever) only delays
its own next delivery, never the watching or an abort. A failure is said once per spell of failures (`warning`),
in words that never quote a secret URL.

The textfile: `<dir>/gpuops-<run>.prom` (`gpuops-<run>-node<rank>.prom` on a node of a torchrun job), written
whole to a hidden temporary in the same folder, mode 0644 (node_exporter runs as another user), and renamed
into place: the collector reads the old file or the new one, never half of one. The Pushgateway: the run's
group `/metrics/job/gpuops/run/<run>` (`/node@base64/<name>` added on a node of a job), replaced by a PUT.
"""

from __future__ import annotations

import base64
import os
import threading
from typing import Callable, Optional

from ..wire.exposition import CONTENT_TYPE

#: A push or a delete waits this long for the Pushgateway at most.
PUSH_TIMEOUT = 5.0


def textfile_name(run: str, node_rank: Optional[int]) -> str:
    """The run's file in the textfile collector's folder (node_exporter reads *.prom)."""
    return "gpuops-%s%s.prom" % (run, "" if node_rank is None else "-node%d" % int(node_rank))


def write_textfile(folder: str, name: str, text: str) -> None:
    """The file replaced whole: a temporary beside it (not *.prom: the collector skips it), then a rename."""
    path = os.path.join(folder, name)
    tmp = os.path.join(folder, ".%s.%d.tmp" % (name, os.getpid()))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
        try:
            data = text.encode("utf-8")
            while data:
                data = data[os.write(fd, data):]
            os.fchmod(fd, 0o644)  # readable by node_exporter's user, whatever the umask
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_textfile(folder: str, name: str) -> None:
    try:
        os.unlink(os.path.join(folder, name))
    except FileNotFoundError:
        pass


#: A run's file that nothing rewrote for this long (its expiry never came: the container restarted) is swept by the
#: next run that writes into the folder: the longest keep_ended there is.
STALE_AFTER = 86400.0


#: A temporary of a writer killed mid-write is this old at least before it is swept.
STALE_TEMPORARY = 3600.0


def sweep(folder: str, own: str, now: Optional[float] = None) -> None:
    """Remove gpuops' run files that nobody rewrote for STALE_AFTER seconds (a live run's is rewritten every
    sample interval; an ended one's goes keep_ended seconds after its end), and temporaries a killed writer left."""
    import time

    now = time.time() if now is None else now
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.startswith("gpuops-") and name.endswith(".prom") and name != own:
            age = STALE_AFTER
        elif name.startswith(".gpuops-") and name.endswith(".tmp"):
            age = STALE_TEMPORARY
        else:
            continue
        path = os.path.join(folder, name)
        try:
            if now - os.lstat(path).st_mtime > age:
                os.unlink(path)
        except OSError:
            pass


def group_url(base: str, run: str, node: str) -> str:
    """The run's group on the Pushgateway: job gpuops, the run's id, and the node's name on a node of a job."""
    url = base.rstrip("/") + "/metrics/job/gpuops/run/" + run
    if node:
        url += "/node@base64/" + base64.urlsafe_b64encode(node.encode("utf-8")).decode().rstrip("=")
    return url


class PushFailed(Exception):
    """The Pushgateway did not take it: `reason` in gpuops' words (a secret URL masked, never quoted)."""


def push(url: str, text: Optional[str], mask: Callable[[str], str]) -> None:
    """PUT the exposition as the group's whole content (text None: DELETE the group)."""
    from ..notify.webhook import post  # urllib: loaded only where a Pushgateway is set

    data = None if text is None else text.encode("utf-8")
    answer = post(url, data, mask, PUSH_TIMEOUT, method="DELETE" if text is None else "PUT", content_type=CONTENT_TYPE)
    if not answer.get("ok"):
        raise PushFailed(str(answer.get("reason") or "HTTP %s" % answer.get("status")))


class Outlet:
    """One place the exposition goes, fed by its own thread: `offer` never waits; the newest text wins."""

    def __init__(self, what: str, deliver: Callable[[str], None], mask: Callable[[str], str]) -> None:
        self.what, self.deliver, self.mask = what, deliver, mask
        self.cond = threading.Condition()
        self.pending: Optional[str] = None
        self.busy = False
        self.failing = False
        self.said: Optional[str] = None  # a failure not yet said (taken by `warning`)
        self.thread: Optional[threading.Thread] = None

    def offer(self, text: str) -> None:
        with self.cond:
            self.pending = text
            self.cond.notify()
            if self.thread is None:
                self.thread = threading.Thread(target=self._work, name="gpuops-metrics", daemon=True)
                self.thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until what was offered is delivered or failed; whether it was."""
        with self.cond:
            return self.cond.wait_for(lambda: self.pending is None and not self.busy, timeout)

    def warning(self) -> Optional[str]:
        """A failure to say, once per spell of failures."""
        with self.cond:
            said, self.said = self.said, None
            return said

    def _work(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.pending is not None)
                text, self.pending, self.busy = self.pending, None, True
            assert text is not None  # waited for
            try:
                self.deliver(text)
                failed = None
            except PushFailed as exc:
                failed = str(exc)
            except OSError as exc:
                failed = exc.strerror or type(exc).__name__
            except Exception as exc:  # noqa: BLE001 - a metrics place must never take the watchdog down
                failed = type(exc).__name__
            with self.cond:
                self.busy = False
                if failed is None:
                    self.failing = False
                elif not self.failing:
                    self.failing = True
                    self.said = self.mask("%s: %s" % (self.what, failed))
                self.cond.notify_all()
