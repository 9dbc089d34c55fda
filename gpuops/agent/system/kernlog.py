"""The host's kernel log, read the way the host can: `journalctl -k` (systemd's journal: this boot's kernel
messages) where it shows them, else `dmesg`. Each reader's command for a read since a time and for following
it, and its lines back into (time, text). Runs on the host (the Proxmox host of a container target, or the
target itself); standard library only.

What the host user may read decides: inside an unprivileged container, and for a user who is not root where
`kernel.dmesg_restrict` is 1, `dmesg` says `dmesg: read kernel buffer failed: Operation not permitted`
(tests/data/real_h200/health/dmesg-as-nobody.txt); `journalctl -k` run by a user outside the adm and
systemd-journal groups shows no kernel messages at all. A machine may have no journalctl (the lent GPU
machine had none: journalctl-k.txt). A journal that answers with no kernel line at all is taken for one this
user cannot see (a booted kernel has logged something), and dmesg is asked.
"""

from __future__ import annotations

import calendar
import re
import subprocess
import time
from typing import Callable, List, Optional, Sequence, Tuple

__all__ = ["DMESG", "JOURNALCTL", "Reader", "parse_stamp", "pick", "read_recent", "read_since"]

#: ISO stamps as the readers print them: dmesg `2026-12-06T05:10:12,266368+00:00`, journalctl
#: short-iso-precise `2026-12-06T05:10:12.266368+00:00` (older systemd: `+0000`).
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?\s")


def parse_stamp(line: str) -> Tuple[Optional[float], str]:
    """(seconds since the epoch, the rest of the line); (None, line) when it starts with no ISO stamp."""
    m = _STAMP.match(line)
    if m is None:
        return None, line
    t = float(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")))
    if m.group(2):
        t += float("0." + m.group(2))
    zone = m.group(3) or "Z"
    if zone != "Z":
        sign = -1 if zone[0] == "+" else 1
        digits = zone[1:].replace(":", "")
        t += sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return t, line[m.end():]


class Reader:
    """One way to read the kernel log: its name, its argv for a read since `since` (seconds since the epoch,
    the host's clock) and for following it from then."""

    def __init__(self, name: str, read: Callable[[float], List[str]], follow: Callable[[float], List[str]]) -> None:
        self.name, self._read, self._follow = name, read, follow

    def read_argv(self, since: float) -> List[str]:
        return self._read(since)

    def follow_argv(self, since: float) -> List[str]:
        return self._follow(since)

    def __repr__(self) -> str:
        return "Reader(%s)" % self.name


_JOURNAL = ["journalctl", "-k", "-q", "--no-pager", "-o", "short-iso-precise"]
JOURNALCTL = Reader("journalctl", lambda since: _JOURNAL + ["--since", "@%d" % int(since)],
                    lambda since: _JOURNAL + ["-f", "--since", "@%d" % int(since)])
#: dmesg reads the whole ring buffer (since boot, at most its size); the time filter is gpuops'.
DMESG = Reader("dmesg", lambda since: ["dmesg", "--time-format", "iso"],
               lambda since: ["dmesg", "--time-format", "iso", "--follow"])

Run = Callable[[Sequence[str]], Tuple[int, str]]


def run_argv(argv: Sequence[str], timeout: float = 30.0) -> Tuple[int, str]:
    """A reader's one-shot command: (exit status, stdout and stderr); 127 when it is not installed."""
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout)
    except FileNotFoundError:
        return 127, "%s: command not found" % argv[0]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 126, "%s: %s" % (argv[0], exc)
    return done.returncode, done.stdout.decode("utf-8", "replace")


def pick(run: Run = run_argv) -> Tuple[Optional[Reader], str]:
    """The reader that shows this user the kernel's messages, and what was tried; (None, why) when none does."""
    code, out = run(_JOURNAL + ["-n", "1"])
    if code == 0 and any(parse_stamp(x)[0] is not None for x in out.splitlines()):
        return JOURNALCTL, ""
    why = ("journalctl: not installed" if code == 127 else
           "journalctl -k shows this user no kernel messages" if code == 0 else
           "journalctl -k: " + _said(out, code))
    code, out = run(["dmesg", "--time-format", "iso"])
    if code == 0:
        return DMESG, why
    return None, why + "; dmesg: " + ("not installed" if code == 127 else _said(out, code))


Records = List[Tuple[float, str]]


def read_since(reader: Reader, since: float, run: Run = run_argv) -> Tuple[Optional[Records], str]:
    """The kernel log's records at or after `since`, as (time, text); (None, why) when the reader failed."""
    code, out = run(reader.read_argv(since))
    if code != 0:
        return None, "%s: %s" % (reader.name, _said(out, code))
    return _records(out, since), ""


def read_recent(since: float, run: Run = run_argv) -> Tuple[Optional[Reader], Records, str]:
    """The records since `since` through the reader that works here (as `pick` chooses it, dmesg read once):
    (reader, records, ""), or (None, [], why) when the kernel log cannot be read."""
    code, out = run(_JOURNAL + ["-n", "1"])
    if code == 0 and any(parse_stamp(x)[0] is not None for x in out.splitlines()):
        found, why = read_since(JOURNALCTL, since, run)
        return (JOURNALCTL, found, "") if found is not None else (None, [], why)
    why = ("journalctl: not installed" if code == 127 else
           "journalctl -k shows this user no kernel messages" if code == 0 else
           "journalctl -k: " + _said(out, code))
    code, out = run(DMESG.read_argv(since))
    if code != 0:
        return None, [], why + "; dmesg: " + ("not installed" if code == 127 else _said(out, code))
    return DMESG, _records(out, since), ""


def _records(out: str, since: float) -> Records:
    found = []
    for line in out.splitlines():
        t, text = parse_stamp(line)
        if t is not None and t >= since:
            found.append((t, text))
    return found


def _said(out: str, code: int) -> str:
    lines = [x.strip() for x in out.splitlines() if x.strip() and not x.startswith(("Hint:", "      "))]
    return (lines[-1] if lines else "exit %d" % code)[:300]
