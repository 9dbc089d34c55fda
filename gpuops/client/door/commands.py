"""The commands the door sends to a target, as values: each runs one shipped tool of gpuops/agent, named as
that tool is (a dry run renders them too); a record a tool reads on its stdin is one line of JSON (dumps)."""

from __future__ import annotations

import json
from typing import Any

from gpuops.agent.wire.health import HEALTH_FIELDS
from gpuops.agent.wire.smi import sample_argv
from gpuops.client.door.bundle import python_tool, shell_tool
from gpuops.command import Cmd, Script, bash


def dumps(record: dict[str, Any]) -> str:
    """A record as one line of JSON (so it can travel inside a shell word)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def probe(sessions: tuple[str, ...] | None = None, *, samples: bool = False, python: bool = True,
          health: bool = False) -> Cmd:
    """Clock, GPUs, tools, and each session's run (None: every session gpuops knows there); `python`:
    python3's version too (a Python start: preflight needs it, status does not); `health`: the GPUs' health
    fields in the same nvidia-smi query (agent/wire/health.py)."""
    return shell_tool("probe", *(["-s"] if samples else []), *([] if python else ["-n"]), *_health(health),
                      *(sessions or ()))


def _health(on: bool) -> list[str]:
    return ["-H", ",".join(HEALTH_FIELDS)] if on else []


def lock(session: str, holder: str, gpus: tuple[int, ...], *, health: bool = False) -> Cmd:
    """The launch lock of the session and its GPUs, held while heartbeats come on stdin; `health`: the probe
    under it reads the GPUs' health too."""
    return shell_tool("lock", *_health(health), session, holder, *map(str, gpus))


def xids(window: float) -> Cmd:
    """On the host: the Xids of its kernel log's last `window` seconds, classified (agent/run/xids.py)."""
    return python_tool("xids", str(int(window)))


def host_watch() -> Cmd:
    """On the host: follow its kernel log for a run's GPUs while the run lives (the spec on stdin)."""
    return python_tool("host-watch")


def host_link(run_id: str) -> Cmd:
    """Beside the run: what the host's follower hands over, into the run directory (the follower starts it)."""
    return python_tool("host-link", run_id)


def forget_lock(session: str, holder: str, gpus: tuple[int, ...]) -> Cmd:
    """Take a launcher's name off its lock files (its connection, and so its lock holder, is gone)."""
    return shell_tool("lock", "--forget", session, holder, *map(str, gpus))


def kill_marked(run_id: str) -> Cmd:
    """Kill every process of the run that is left."""
    return shell_tool("kill_marked", run_id)


def warmup(run_id: str, gpu: int, command: str) -> Cmd:
    return shell_tool("warmup", run_id, str(gpu), command)


def prepare(run_id: str) -> Cmd:
    """Create the run directory from the JSON spec sent on stdin."""
    return python_tool("prepare", run_id)


def record(run_id: str, name: str) -> Cmd:
    """Rewrite one JSON record of the run (sent on stdin)."""
    return python_tool("record", run_id, name)


def start(run_id: str) -> Cmd:
    """Start the watchdog, then training in tmux."""
    return python_tool("start", run_id)


def abort(run_id: str, by: str) -> Cmd:
    """The one abort sequence (the record on stdin); waits for it to finish."""
    return python_tool("abort", run_id, by)


def follow(run_id: str, session: str, offset: int, inode: int, tail: int, once: bool, events_offset: int) -> Cmd:
    return python_tool("follow", run_id, session, str(offset), str(inode), str(tail), "1" if once else "0",
                       str(events_offset))


def runs(limit: int, playbook: str | None = None) -> Cmd:
    """The run history, newest first: `limit` runs (of `playbook`, filtered before the limit)."""
    return python_tool("runs", str(limit), *(() if playbook is None else (playbook,)))


def metrics(playbook: str | None = None) -> Cmd:
    """The runs that go on or ended within their keep_ended (of `playbook`), one snapshot each, for Prometheus."""
    return python_tool("metrics", *(() if playbook is None else (playbook,)))


def notify_test() -> Cmd:
    """Each notify channel tried once, from the target (the channels, payload and env on stdin)."""
    return python_tool("notify-test")


def kill_session(session: str) -> Cmd:
    """End a tmux session that has no run record (nothing of gpuops to stop in it)."""
    return Cmd("tmux", "kill-session", "-t", f"={session}")


def report(run_id: str | None, session: str) -> Cmd:
    """One run's records, samples and events for its report (run_id None: the session's current run)."""
    return python_tool("report", *((run_id,) if run_id else ("-s", session)))


def gpu_memory(gpus: tuple[int, ...]) -> Cmd:
    """Memory used and utilisation of some GPUs, one `index, MiB, %` line each (bash says so if nvidia-smi is missing)."""
    return bash(Script(Cmd(*sample_argv(gpus))))


def stacks(run_id: str, recorded: bool) -> Cmd:
    """Every thread's stack of the run's Python processes: taken now (the run goes on), or as last recorded."""
    return python_tool("stacks", run_id, *(("recorded",) if recorded else ()))
