"""The wire's markers: the lines gpuops' agent tools print, and for each tool the one parser of its reply.

The shell tools in ``sh/`` print these markers too, and tests/agent/test_agent_package.py checks that each one
they print is in ``MARKS`` and that no other module reads marker lines. (The records' names and the run
states a reply carries are ``protocol``'s; a probe's run is read into ``runinfo.RunInfo``.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .health import HealthReading, parse_health
from .runinfo import RunInfo
from .smi import Gpu, SmiError, parse_apps, parse_gpus

# -- markers: lines the target tools print for the client to read ------------------------------
MARK = "@@gpuops "
MARKS = frozenset({
    # bootstrap
    "need-lib",
    # probe.sh
    "now", "gpus", "gpus_rc", "apps", "apps_rc", "nosmi", "notmux", "nopython", "python", "session", "alive",
    "locked", "run", "meta", "exit", "abort", "abort_done", "log", "watchdog", "watchdog_pid", "samples", "samples_end",
    "guard_counts",
    # lock.sh
    "busy", "stale", "gpu-held", "locked-ok",
    # kill_marked.sh, abort, start (probe.sh says "started" too)
    "killed", "survivors", "session-gone", "gpus-after", "stopped", "session-exists", "started", "watchdog-failed",
    "aborted", "already", "claimed", "prepared", "recorded",
    # stacks
    "stacks",
    # notify-test
    "notified",
    # probe.sh -H (the GPUs' health), the run's hardware record and host follower
    "health_fields", "health", "health_rc", "health_refused", "hardware", "host_log", "host_log_pid", "host_xid",
    "host_log_end",
    # the host's kernel-log tools (wire/hostwire.py)
    "kernel_log", "kernel_log_refused", "xid", "host-watch", "host-watch-off",
})
#: Exit status of a command that found gpuops' target files missing (the client installs them, then retries).
NEED_LIB_EXIT = 97
#: Exit status of warmup.sh / start when `gpuops stop` ended the launch before training started. Start's
#: `stopped` mark says so; of a warmup, only abort.json does (the warmup may exit 86 itself).
STOPPED_EXIT = 86
#: Exit status of a tool that cannot create its folders or records under ~/.gpuops (lock.sh, prepare, record,
#: the copy of gpuops' files): the target user's home is not writable.
CANNOT_CREATE_EXIT = 70
#: Exit status of the copy of gpuops' files when the zip could not be received or unpacked.
UNPACK_FAILED_EXIT = 71


def mark(key: str, value: str = "") -> str:
    """One marker line (without its newline)."""
    assert key in MARKS, key
    return MARK + key + (" " + value if value else "")


def marks(text: str) -> Iterator[Tuple[str, str]]:
    """(key, value) of every marker line in text, in order."""
    for line in text.splitlines():
        if line.startswith(MARK):
            key, _, value = line[len(MARK):].partition(" ")
            yield key, value


def _object(text: str) -> Dict[str, Any]:
    """A marker's JSON object value; {} when it is garbled or no object."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _int(text: str) -> Optional[int]:
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else None


# -- each tool's reply, parsed beside its markers (the client and the agent both read them here) --
def said_need_lib(out: str, exit_code: Optional[int] = None) -> bool:
    """The bootstrap found gpuops' files missing on the target (the client installs them, then retries);
    exit_code None: the tool ran inside another command (pct_exec.sh) whose status says nothing."""
    return (exit_code is None or exit_code == NEED_LIB_EXIT) and mark("need-lib") in out


@dataclass
class ProbeSession:
    """A tmux session probe.sh was asked about: whether it lives, who holds its launch lock, its current run."""

    session: str
    alive: bool = False
    locked_by: Optional[str] = None
    run: Optional[RunInfo] = None


@dataclass
class ProbeReply:
    """probe.sh's answer: the target's clock, GPUs, tools and each session's run, in one reply. The raw
    nvidia-smi sections and their exit codes are kept beside what they were read as."""

    now: Optional[float] = None
    smi: str = "ok"  # ok | absent (no nvidia-smi on the target) | error
    smi_error: Optional[str] = None
    gpus: List[Gpu] = field(default_factory=list)
    gpus_text: str = ""
    apps_text: str = ""
    gpus_rc: int = 1
    apps_rc: int = 1
    tmux: bool = True
    python: Optional[Tuple[int, ...]] = None  # the target's python3 version; None when it has none
    sessions: Dict[str, ProbeSession] = field(default_factory=dict)
    #: probe.sh -H: the GPUs' health (None: not asked, or nvidia-smi gave no table), the fields this driver refused
    health: Optional["HealthReading"] = None
    health_fields: Tuple[str, ...] = ()
    health_refused: List[str] = field(default_factory=list)

    @property
    def smi_found(self) -> bool:
        """The target has nvidia-smi (it may still have failed)."""
        return self.smi != "absent"


def parse_probe(text: str) -> ProbeReply:
    """probe.sh's marked sections (and lock.sh's, which ends with a probe) back into values."""
    reply = ProbeReply()
    section: Optional[str] = None
    buf: Dict[str, List[str]] = {"gpus": [], "apps": [], "samples": []}
    current: Optional[ProbeSession] = None
    for line in text.splitlines():
        if not line.startswith(MARK):
            if section is not None:
                buf[section].append(line)
            continue
        key, _, value = line[len(MARK):].partition(" ")
        section = key if key in buf else None
        if key == "now":
            reply.now = float(value) if value else None
        elif key in ("gpus_rc", "apps_rc"):
            setattr(reply, key, int(value or 1))
        elif key == "health_fields":
            reply.health_fields = tuple(f for f in value.strip().split(",") if f)
        elif key == "health_refused":
            reply.health_refused.append(value.strip())
        elif key == "nosmi":
            reply.smi = "absent"
        elif key == "notmux":
            reply.tmux = False
        elif key == "python":
            parts = value.strip().split(".")
            reply.python = tuple(int(x) for x in parts) if all(x.isdigit() for x in parts) else None
        elif key == "samples":
            buf["samples"] = []
        elif key == "samples_end":
            if current is not None and current.run is not None:
                current.run.samples_text = "\n".join(buf["samples"])
        elif key == "session":
            current = reply.sessions.setdefault(value, ProbeSession(value))
        elif current is not None:
            _probe_field(current, key, value)
    reply.gpus_text, reply.apps_text = "\n".join(buf["gpus"]), "\n".join(buf["apps"])
    _read_gpus(reply)
    for state in reply.sessions.values():
        if state.run is not None:
            state.run.session_alive, state.run.remote_now = state.alive, reply.now
            state.run.meta["launcher_alive"] = state.locked_by is not None
    return reply


def _read_gpus(reply: ProbeReply) -> None:
    """The GPUs from nvidia-smi's two sections, or why there are none (its failure, in its own words). With the
    health fields, a query that failed for a lost GPU still gives the others' rows (and the lost one's line)."""
    if reply.smi == "absent":
        return
    if reply.health_fields:
        try:
            reply.health = parse_health(reply.gpus_text, reply.health_fields)
        except SmiError:
            reply.health = None
        if reply.health is not None and (reply.health.gpus or reply.health.lost) and reply.apps_rc == 0:
            try:
                apps = parse_apps(reply.apps_text)
            except SmiError as exc:
                reply.smi, reply.smi_error = "error", str(exc)
                return
            reply.gpus = [Gpu(h.index, h.uuid or "", h.count("memory.used") or 0, h.count("memory.total") or 0,
                              h.count("utilization.gpu"), tuple(apps.get(h.uuid or "", ()))) for h in reply.health.gpus]
            return
    if reply.gpus_rc != 0 or reply.apps_rc != 0:
        reply.smi = "error"
        failed = reply.gpus_text if reply.gpus_rc != 0 else reply.apps_text  # a missing driver fails both alike
        reply.smi_error = " ".join(failed.split())[:300] or "nvidia-smi failed"
        return
    try:
        reply.gpus = parse_gpus(reply.gpus_text, reply.apps_text)
    except SmiError as exc:
        reply.smi, reply.smi_error = "error", str(exc)


def _probe_field(state: ProbeSession, key: str, value: str) -> None:
    if key == "alive":
        state.alive = True
    elif key == "locked":
        state.locked_by = value or "another gpuops launch"
    elif key == "run":
        state.run = RunInfo(value, state.session)
    elif state.run is None:
        return
    elif key in ("meta", "abort", "abort_done", "watchdog", "hardware", "host_log", "host_log_end"):
        setattr(state.run, key, _object(value))
    elif key == "host_log_pid":
        state.run.host_log_alive = value.strip() == "alive"
    elif key == "host_xid":
        state.run.host_xids.append(_object(value))
    elif key == "exit":
        state.run.exit_code = _int(value)
    elif key == "started":
        state.run.started = True
    elif key == "guard_counts":
        state.run.guard_counts.append(_object(value))
    elif key == "watchdog_pid":
        state.run.watchdog_running = value.strip() == "alive"
    elif key == "log":
        size, _, mtime = value.partition(" ")
        state.run.log_size, state.run.log_mtime = int(size), float(mtime)


#: lock.sh prints this line once it holds the locks (a probe taken under them comes before it).
LOCKED_OK_LINE = ("\n" + MARK + "locked-ok\n").encode()


@dataclass
class LockReply:
    """lock.sh's answer: who holds the session (busy) or a GPU (gpu_held: gpu, holder), a stale holder, and
    the probe taken under the locks (None: refused)."""

    busy: Optional[str] = None
    gpu_held: Optional[Tuple[str, str]] = None
    stale: Optional[str] = None
    probe: Optional[ProbeReply] = None

    @property
    def refused(self) -> bool:
        return self.busy is not None or self.gpu_held is not None


def parse_lock(text: str) -> LockReply:
    reply = LockReply()
    for key, value in marks(text):
        if key == "busy" and not reply.refused:
            reply.busy = value.strip()
        elif key == "gpu-held" and not reply.refused:
            gpu, _, holder = value.partition(" ")
            reply.gpu_held = (gpu, holder)
        elif key == "stale":
            reply.stale = value.strip()
    if not reply.refused:
        reply.probe = parse_probe(text)
    return reply


@dataclass
class StartReply:
    """start's answer: stopped (by `gpuops stop`), the session existed, the watchdog failed (why), started."""

    stopped: bool = False
    session_exists: bool = False
    watchdog_failed: Optional[str] = None
    started: bool = False


def parse_start(text: str) -> StartReply:
    said = dict(marks(text))
    return StartReply("stopped" in said, "session-exists" in said, said.get("watchdog-failed"), "started" in said)


@dataclass
class AbortReply:
    """abort's answer: the record it claimed, or the one that was there already; then abort-done's record.
    `sent`: the record the caller asked it to claim."""

    claimed: Optional[Dict[str, Any]] = None
    already: Optional[Dict[str, Any]] = None
    done: Optional[Dict[str, Any]] = None
    sent: Dict[str, Any] = field(default_factory=dict)

    @property
    def won(self) -> bool:
        """False: someone else had already claimed the abort."""
        return self.already is None

    @property
    def record(self) -> Dict[str, Any]:
        """The record in force: the one sent, or the one of who stopped the run first."""
        return self.sent if self.already is None else self.already

    @property
    def by(self) -> Optional[str]:
        return self.record.get("by")

    @property
    def survivors(self) -> List[int]:
        return [int(x) for x in (self.done or {}).get("survivors") or [] if isinstance(x, int)]

    @property
    def gpus(self) -> List[Dict[str, Any]]:
        return list((self.done or {}).get("gpus") or [])

    @property
    def held_by(self) -> Dict[str, List[int]]:
        """GPU -> pids, for a GPU that did not drain."""
        held = (self.done or {}).get("held_by") or {}
        return {str(g): [int(x) for x in pids if isinstance(x, int)] for g, pids in held.items() if isinstance(pids, list)}

    @property
    def seconds(self) -> float:
        return float((self.done or {}).get("seconds") or 0.0)

    @property
    def session_gone_at(self) -> Optional[float]:
        """When the run's tmux session went (the target's clock)."""
        return (self.done or {}).get("session_gone_at")


def parse_abort(text: str, sent: Optional[Dict[str, Any]] = None) -> AbortReply:
    reply = AbortReply(sent=dict(sent or {}))
    for key, value in marks(text):
        if key in ("claimed", "already"):
            setattr(reply, key, _object(value))
        elif key == "aborted":
            reply.done = _object(value)
    return reply


def parse_stacks(text: str) -> List[Dict[str, Any]]:
    """stacks' answer: one {pid, file, threads, via, text[, attempt, error]} per Python process of the run."""
    return [row for key, value in marks(text) if key == "stacks" for row in [_object(value)] if row]


def parse_notify_test(text: str) -> List[Dict[str, Any]]:
    """notify-test's answer: one object per channel, in the playbook's order (what it answered)."""
    return [_object(value) for key, value in marks(text) if key == "notified"]


def parse_kill_marked(text: str) -> List[int]:
    """kill_marked.sh's answer: the pids that survived SIGKILL."""
    for key, value in marks(text):
        if key == "survivors":
            return [int(x) for x in value.split() if x.isdigit()]
    return []
