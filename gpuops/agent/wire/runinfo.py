"""One run as its run directory says it (read by probe.sh, parsed in marks.parse_probe): its records' raw
values, and what they mean (its state, its exit code, its JSON in `status`). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from . import protocol as p
from .protocol import RunState
from .verdict import record_view


@dataclass
class RunInfo:
    """What the run directory says about one run."""

    run_id: str
    session: str = ""
    meta: Dict[str, Any] = field(default_factory=dict)
    exit_code: Optional[int] = None
    abort: Optional[Dict[str, Any]] = None
    log_size: Optional[int] = None
    log_mtime: Optional[float] = None
    session_alive: bool = False
    remote_now: Optional[float] = None
    abort_done: Optional[Dict[str, Any]] = None
    watchdog: Optional[Dict[str, Any]] = None  # its heartbeat record (watchdog.json)
    watchdog_running: bool = True  # False: neither the watchdog nor its supervisor has a live process
    samples_text: str = ""  # the tail of samples.jsonl, when asked for
    guard_counts: List[Dict[str, Any]] = field(default_factory=list)  # the compile guard's, one per process
    started: bool = False  # its `started` record: training's tmux session was created (this attempt's)
    hardware: Optional[Dict[str, Any]] = None  # hardware.json: the GPU fault that ended it
    host_log: Optional[Dict[str, Any]] = None  # host-xids.jsonl's first record: the host's kernel-log follower
    host_log_alive: bool = False  # its link beside the run lives
    host_log_end: Optional[Dict[str, Any]] = None  # its last record, once the link ended: why
    host_xids: List[Dict[str, Any]] = field(default_factory=list)  # the last Xids it handed over

    @property
    def host_kernel_log(self) -> Optional[Dict[str, Any]]:
        """The host's kernel-log follower as `status` shows it: following, ended, or off (and why: meta.json, as
        the launch found the host), with its reader and the Xids it handed over."""
        said = self.meta.get("host_kernel_log") if isinstance(self.meta.get("host_kernel_log"), dict) else None
        if self.host_log is None:
            return None if said is None else {"state": said.get("state") or "off", "why": said.get("why"),
                                               "reader": None, "host_pid": None, "xids": []}
        return {"state": "following" if self.host_log_alive else "ended", "why": None if self.host_log_alive else
                (self.host_log_end or {}).get("why"), "reader": self.host_log.get("reader"),
                "host_pid": self.host_log.get("host_pid"),
                "xids": [{k: x.get(k) for k in ("code", "name", "index", "bus_id", "resolution", "t")}
                         for x in self.host_xids if x]}

    @property
    def compile_guard(self) -> Optional[Dict[str, Any]]:
        """The compile guard's counts summed over the run's processes; None when it is off and counted nothing."""
        if not self.guard_counts and not self.meta.get("compile_guard"):
            return None
        total = {k: sum(c.get(k) or 0 for c in self.guard_counts if isinstance(c.get(k) or 0, (int, float)))
                 for k in ("compiled", "serialized", "first_call_s", "waits", "waited_s", "unguarded",
                           "backward_holds", "backward_timeouts")}
        total = {k: round(v, 3) if isinstance(v, float) else v for k, v in total.items()}
        return {"processes": len(self.guard_counts), **total}

    @property
    def state(self) -> RunState:
        """warming | running | restarting | exited | aborting | aborted | stalled | not-started | lost."""
        wd = self.watchdog or {}
        if not self.session_alive and self.watchdog_alive and (wd.get("state") == "restarting" or wd.get("restart_due")):
            return RunState.RESTARTING  # an attempt ended; the watchdog starts the next one (a stop ends it for good)
        if self.abort is not None:
            if self.abort_done is None and self.session_alive:
                return RunState.ABORTING
            stalled = self.abort.get("reason") == "stall" or (self.abort.get("reason") == p.JOB_ABORT and
                                                               self.abort.get("first_reason") == "stall")
            if self.outcome_code() == p.ExitCode.HARDWARE:
                return RunState.HARDWARE
            return RunState.STALLED if stalled else RunState.ABORTED
        if self.exit_code is not None:
            return RunState.HARDWARE if self.outcome_code() == p.ExitCode.HARDWARE else RunState.EXITED
        if self.session_alive:
            return RunState.RUNNING
        if self.meta.get("phase") == p.PHASE_RUNNING and not self.started and self.meta.get("launcher_alive"):
            # meta.json says running one round trip before `start` has made the tmux session: still the launch
            return RunState.WARMING
        if self.meta.get("phase") in p.WARMING_PHASES:
            return RunState.WARMING if self.meta.get("launcher_alive") else RunState.NOT_STARTED
        if self.meta.get("phase") in p.NOT_STARTED_PHASES:
            return RunState.NOT_STARTED
        return RunState.HARDWARE if self.hardware is not None else RunState.LOST

    @property
    def watchdog_age(self) -> Optional[float]:
        """Seconds since the watchdog's last heartbeat (the target's clock); None when it never wrote one."""
        ts = (self.watchdog or {}).get("ts")
        if not isinstance(ts, (int, float)) or self.remote_now is None:
            return None
        return max(0.0, self.remote_now - ts)

    @property
    def watchdog_alive(self) -> bool:
        age = self.watchdog_age
        fresh = age is not None and age < p.HEARTBEAT_STALE
        return fresh and self.watchdog_running and (self.watchdog or {}).get("state") != "done"

    @property
    def alive(self) -> bool:
        return self.session_alive or self.state in (RunState.WARMING, RunState.RESTARTING)

    @property
    def attempts(self) -> int:
        """The run's current attempt number (1 unless the watchdog restarted training)."""
        n = (self.watchdog or {}).get("attempt")
        return n if isinstance(n, int) and n >= 1 else 1

    @property
    def seconds_since_log(self) -> Optional[float]:
        if self.log_mtime is None or self.remote_now is None:
            return None
        return max(0.0, self.remote_now - self.log_mtime)

    def outcome_code(self) -> Optional[int]:
        """The exit code gpuops reports for this run once it has ended (the one mapping, records.outcome)."""
        from .records import outcome

        if self.abort is None and self.exit_code is None and self.hardware is None:
            return None
        code_text = None if self.exit_code is None else str(self.exit_code)
        return outcome(code_text, self.abort, self.session_alive, self.hardware)[1]

    def as_json(self) -> Dict[str, Any]:
        """The run as `status --json` says it (docs/json.md)."""
        return {
            "id": self.run_id,
            "session": self.session,
            "state": self.state,
            "attempts": self.attempts,
            "max_attempts": (self.watchdog or {}).get("max_attempts") or 1,
            "exit_code": self.outcome_code(),  # gpuops' exit code for the run, as `runs` and the summary say
            "command_exit_code": self.exit_code,  # the training command's own exit status
            "started_at": self.meta.get("started_at"),
            "playbook": self.meta.get("playbook"),
            **({"job": self.meta["job"]} if isinstance(self.meta.get("job"), dict) else {}),  # a node of a torchrun job
            "seconds_since_log": self.seconds_since_log,
            "log_bytes": self.log_size,
            "abort": self.abort,
            "stopped_by": (self.abort or {}).get("by"),
            "last_match": (self.hardware or {}).get("rule") or (self.abort or {}).get("rule") or self.meta.get("last_match"),
            "watchdog": None if self.watchdog is None else {
                "alive": self.watchdog_alive,
                "heartbeat_age": None if self.watchdog_age is None else round(self.watchdog_age, 1),
                "state": self.watchdog.get("state"),
                "restarts": self.watchdog.get("restarts"),
                "disabled_rules": self.watchdog.get("disabled_rules") or [],
                "wait": self.watchdog.get("wait"),  # inotify, or poll (why): how it waits for the log
            },
            "telemetry": (self.watchdog or {}).get("telemetry"),
            **({"hang": (self.abort_done or {})["hang"]}  # a stalled torchrun job: where it hung (wire/hang.py)
               if isinstance((self.abort_done or {}).get("hang"), dict) else {}),
            "compile_guard": self.compile_guard,
            "hardware": None if self.hardware is None else record_view(self.hardware),
            "host_kernel_log": self.host_kernel_log,
        }
