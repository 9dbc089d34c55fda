"""The wire protocol between gpuops and its target: paths, record names, states, phases and frames.

Both sides import this module (the client as ``gpuops.agent.wire.protocol``, the target as
``gpuops_agent.wire.protocol``), so a record or a frame is spelled and parsed in one place. The marker
lines each tool prints and each reply's type and parser are in ``marks.py``, beside one another; the
shell tools in ``sh/`` print markers too, and tests/agent/test_agent_package.py checks that every marker
they print is one of ``marks.MARKS``.
"""

from __future__ import annotations

import os
from enum import Enum
from typing import Optional

from .exits import ExitCode  # noqa: F401  (the contract's exit codes, one definition for both sides)
from .frames import (  # noqa: F401  (the wire's names, one import for both sides)
    FRAME_DATA,
    FRAME_END,
    FRAME_EVENTS,
    FRAME_HEARTBEAT,
    FRAME_ROTATED,
    FRAME_TRUNCATED,
    Data,
    Ended,
    Frame,
    FrameReader,
    Heartbeat,
    Reset,
    WatchdogEvent,
    data_frame,
    end_frame,
    events_frame,
    heartbeat_frame,
    rotated_frame,
    truncated_frame,
)

#: The version of every record the agent writes in a run directory and of every JSON object `--json`
#: prints, as their `schema_version`. Readers take a record without one for an older run's (version 0), and
#: say when a run's records are newer than this. 2: `restarted` is told when the next attempt has started,
#: `ended` carries `restart_failed`, events a client does not know are `unknown_event`s (docs/json.md).
SCHEMA_VERSION = 2


def versioned(record: dict) -> dict:
    """The record, given its schema_version in place (so what a writer returns is what it wrote); one
    that has a version keeps it."""
    record.setdefault("schema_version", SCHEMA_VERSION)
    return record


# -- where things live on the target (relative to the target user's $HOME) --------------------
STATE_DIR = ".gpuops"
RUNS = "runs"
SESSIONS = "sessions"
LOCKS = "locks"
LIB = "lib"
PACKAGE = "gpuops_agent"  # the name this package has on the target

from .stackfile import STACKS  # noqa: F401  (stacks/<pid>.txt: the run's thread stacks; names and parser there)

# -- records in a run directory ----------------------------------------------------------------
LOG = "log"
EXIT_CODE = "exit_code"  # the command's exit status once it ended (128+N for signal N)
EXIT_CODE_REAPED = "exit_code.reaped"  # the status of a command whose session vanished, ended by the reap
META = "meta.json"  # what was launched: playbook, command, env (secrets masked), GPUs, phase
ENV = "env.sh"  # the exports of the playbook's env (mode 0600: it holds the secret values)
COMMAND = "command"  # the training command, as the playbook writes it
RESTART_COMMAND = "restart-command"  # restart.command: what restarted attempts run in place of COMMAND (sh/run.sh)
WORKDIR = "workdir"  # where warmup and training run, as run.sh resolves it
WATCH = "watch.json"  # the rules, stall timeout, detectors and abort settings the run was launched with
ABORT = "abort.json"  # why the run was stopped and by whom; created once (the claim), never replaced
ABORT_SIGNALLED = "abort-signalled"  # when the abort's signal went to the run: it is never sent twice
ABORT_DONE = "abort-done.json"  # the abort sequence finished: survivors, GPUs, seconds
ABORT_LOCK = "abort.lock"  # flock'ed by whoever runs the abort sequence: free with a claim not done = its claimer died
EVENTS = "events.jsonl"  # the watchdog's decisions, append-only, one JSON object a line
#: events.jsonl's notes a client shows as a `watchdog` event, `what` naming them (the others it shows as they
#: are: a match, an abort, a restart ...). A kind a client knows neither way is data: an `unknown_event`.
WATCHDOG_NOTES = ("watchdog_restarted", "watchdog_gave_up", "watchdog_resumed", "abort_completed", "note",
                  "telemetry_problem", "session_gone", "profile_failed", "write_failed", "done", "attempt_started",
                  "restart_cancelled", "restart_failed", "job_abort", "job_link", "metrics_failed", "hardware")
WATCHDOG = "watchdog.json"  # the watchdog's heartbeat and resume point, rewritten every second
WATCHDOG_LOG = "watchdog.err"  # the supervisor's and watchdog's own stderr
SUPERVISOR_PID = "supervisor.pid"
WATCHDOG_LOCK = "watchdog.lock"  # flock'ed by the one watchdog of the run
CACHE_SNAPSHOT = "cache-snapshot.txt"  # the inductor cache's files when training started
RUN_ID_ENV = "GPUOPS_RUN_ID"  # in the environment of every process of a run (sh/common.sh load_env): how its processes are found
STARTED = "started"  # written once training's tmux session exists: from then on a missing session means it ended
PROFILE = "profile.json"  # the run's steady figures, written when it ends
SAMPLES = "samples.jsonl"  # recent raw GPU/throughput samples, one JSON object a line
SAMPLES_COARSE = "samples-coarse.jsonl"  # older samples as per-bucket min/median/max
NOTIFY = "notify.jsonl"  # the run's notifications: each one queued (with its payload), each channel's delivery
NOTIFY_DIR = "notify"  # per notification: its payload file, its sender's lock, each command channel's output
COMPILE_GUARD_COUNTS = "compile-guard-counts"  # the compile guard's counts: <pid>.json per Python process that compiled
WARMUP_LOG = "warmup-%d.log"  # a GPU's warmup output (sh/warmup.sh writes it; its mtime is when the warmup last spoke)
#: The GPU fault that ended the attempt (a gpu-* rule, or a stall or crash whose window held an Xid that needs a
#: reset): rule, gpu (index, bus_id, uuid), xid or counter, action (detect/hardware.py). It makes the outcome
#: `hardware`, exit 10 (records.outcome).
HARDWARE = "hardware.json"

# -- one node of a torchrun job (launch.nodes; docs/torchrun.md) --------------------------------
RDZV_ID = "rdzv-id"  # this attempt's torchrun --rdzv-id (run.sh exports it as GPUOPS_RDZV_ID)
JOB_END = "job-end.json"  # the job's end as this node learned it from the rendezvous store (signed, verified)
JOB_LINK_LOG = "job-link.err"  # the job link's own stderr (agent/run/jobstore.py)
JOB_ABORT = "job"  # abort.json reason: another node ended the job; first_node, first_reason, rule say how

# -- attempts: a run the watchdog restarts (playbook `restart:`) -------------------------------
# The top-level records are always the current attempt's; when the watchdog restarts training it
# first moves the ended attempt's records into attempts/<n>/ (n from 1), so every reader of the
# current attempt (follower, probe, abort, status) needs no change, and each attempt's log is kept.
ATTEMPT = "attempt.json"  # {attempt, max_attempts, state, after, compile_guard, until, started}; absent: attempt 1
ATTEMPTS = "attempts"  # attempts/<n>/: the records of attempt n once it ended and a restart followed
#: The records of one attempt, moved together into attempts/<n>/ (abort.json's one claim is per attempt).
ATTEMPT_RECORDS = (LOG, EXIT_CODE, EXIT_CODE_REAPED, ABORT, ABORT_SIGNALLED, ABORT_DONE, STARTED, PROFILE, SAMPLES,
                   SAMPLES_COARSE, CACHE_SNAPSHOT, COMPILE_GUARD_COUNTS, STACKS, JOB_END, HARDWARE)
#: attempt.json states: the next attempt waits out its delay (and warmup), is being started, or runs;
#: `stopped`: `gpuops stop` / --timeout ended the run during the wait.
ATTEMPT_WAITING, ATTEMPT_STARTING, ATTEMPT_RUNNING, ATTEMPT_STOPPED = "waiting", "starting", "running", "stopped"
ATTEMPT_PENDING = (ATTEMPT_WAITING, ATTEMPT_STARTING)
#: The watchdog's heartbeat state between two attempts.
WATCHDOG_RESTARTING = "restarting"
#: restart.on names that are no rule: the stall timeout, and training exiting non-zero without a rule.
RESTART_STALL, RESTART_FAILED = "stall", "failed"
#: The events a notification channel may be told of (playbook `notify[].on`), its default, and notify-test's.
NOTIFY_WHATS = ("aborted", "restarted", "ended", "warned", "stalled")
NOTIFY_DEFAULT_ON = ("aborted", "restarted", "ended")
NOTIFY_TEST = "test"
#: The compile guard (agent/guard/): the job sees this set to 1 when the guard is on.
GPUOPS_COMPILE_GUARD = "GPUOPS_COMPILE_GUARD"
COMPILE_GUARD = "compile-guard"  # present: run.sh and warmup.sh put the guard on (sh/common.sh guard_env)
GUARD_PYTHONPATH = "guard/pythonpath"  # under the agent package: the folder guard_env puts first on PYTHONPATH


def attempt_dir(d: str, n: int) -> str:
    """Where attempt n's records are kept once it ended and a restart followed."""
    return os.path.join(d, ATTEMPTS, "%d" % int(n))

#: A watchdog whose heartbeat is older than this is taken for gone: clients stand in for it.
HEARTBEAT_STALE = 10.0
#: Seconds between watchdog heartbeats.
HEARTBEAT_EVERY = 2.0

def state_dir(home: Optional[str] = None) -> str:
    return os.path.join(home or os.path.expanduser("~"), STATE_DIR)


def check_run_id(run_id: str) -> str:
    """Run ids hold only [0-9a-z-] (they name folders and travel in shell words)."""
    if not run_id or len(run_id) > 64 or any(c not in "0123456789abcdefghijklmnopqrstuvwxyz-" for c in run_id):
        raise ValueError("not a run id: %r" % (run_id,))
    return run_id


def run_dir(run_id: str, home: Optional[str] = None) -> str:
    return os.path.join(state_dir(home), RUNS, check_run_id(run_id))




# -- a launch's phases, as meta.json's `phase` says ---------------------------------------------
PHASE_PREFLIGHT, PHASE_WARMUP, PHASE_RUNNING = "preflight", "warmup", "running"
PHASE_WARMUP_FAILED, PHASE_START_FAILED = "warmup-failed", "start-failed"
PHASE_INTERRUPTED, PHASE_CONNECTION_LOST = "interrupted", "connection-lost"
#: The launch is still warming up (while its launcher lives).
WARMING_PHASES = frozenset({PHASE_PREFLIGHT, PHASE_WARMUP})
#: The launch ended before training started: its phase -> gpuops' exit code, as the launch exited.
NOT_STARTED_EXIT = {PHASE_WARMUP_FAILED: ExitCode.WARMUP, PHASE_START_FAILED: ExitCode.TRAINING_FAILED,
                    PHASE_INTERRUPTED: ExitCode.INTERRUPTED, PHASE_CONNECTION_LOST: ExitCode.CONNECT}
NOT_STARTED_PHASES = frozenset(NOT_STARTED_EXIT)


class RunState(str, Enum):
    """Every state a run is reported in (status's `state`, runs' and profile.json's `outcome`).

    A str: it compares equal to, prints as and serialises as its value, the word users see.
    """

    WARMING = "warming"  # preflight or warmup, its launcher alive
    RUNNING = "running"  # training's tmux session lives
    ABORTING = "aborting"  # an abort was claimed; the sequence has not finished
    RESTARTING = "restarting"  # an attempt ended; the watchdog starts the next (playbook `restart:`)
    EXITED = "exited"  # status: the command ended on its own (succeeded or failed says its code)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABORTED = "aborted"  # a matched rule (or a detector) stopped it
    HARDWARE = "hardware"  # a GPU of the run failed (hardware.json): a gpu-* rule, or a stall or crash an Xid explains
    STALLED = "stalled"
    TIMEOUT = "timeout"
    STOPPED = "stopped"  # `gpuops stop`
    LOST = "lost"  # no exit status, no abort, its session gone (killed by hand, container stopped)
    NOT_STARTED = "not-started"  # its launch ended before training started (preflight, warmup, the watchdog's start)
    INTERRUPTED = "interrupted"  # its launch was interrupted (Ctrl-C) before training, or a Ctrl-C typed in its pane ended it

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:  # as its value's: a member finds the entry its word keys, and back
        return hash(self.value)

    def is_live(self) -> bool:
        """The run (or its launch) goes on: there is something to follow or to stop."""
        return self in _LIVE

    def is_terminal(self) -> bool:
        """The run has ended; its state will not change again."""
        return self not in _LIVE


_LIVE = frozenset({RunState.WARMING, RunState.RUNNING, RunState.ABORTING, RunState.RESTARTING})
