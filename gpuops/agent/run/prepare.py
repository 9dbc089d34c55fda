"""Create a run directory and rewrite its records: the `prepare` and `record` tools.

``prepare RUN_ID`` reads a JSON spec on stdin (so env values of any size travel without the
argv limit) and writes meta.json, env.sh (mode 0600: it holds the secret values), the command,
the workdir and watch.json, then points the session at the run. ``record RUN_ID NAME`` rewrites
one JSON record (meta.json) from stdin, atomically.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict

from ..wire import marks, watchfile
from ..wire import protocol as p
from ..wire.records import write_json_atomic

#: The records `record` may rewrite (the others are written once, by their owners).
#: The records a client may write: meta.json (the launch's phase), hardware.json (a stall or crash it put down to an
#: Xid the host's kernel log shows, where the host's follower did not hand it over: client/gpu_health.explain_end).
REWRITABLE = (p.META, p.HARDWARE)


def _write(path: str, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def prepare(run_id: str, spec: Dict[str, Any], home: str = "") -> str:
    """Make the run directory from the spec; returns its path. Raises OSError where the home is not writable."""
    state = p.state_dir(home or None)
    for sub in (p.RUNS, p.SESSIONS, p.LOCKS):
        os.makedirs(os.path.join(state, sub), exist_ok=True)
    d = p.run_dir(run_id, home or None)
    os.mkdir(d, 0o700)
    os.chmod(d, 0o700)
    write_json_atomic(os.path.join(d, p.META), spec["meta"])
    _write(os.path.join(d, p.ENV), spec["env"], 0o600)
    _write(os.path.join(d, p.COMMAND), spec["command"], 0o600)
    _write(os.path.join(d, p.WORKDIR), spec.get("workdir") or "", 0o600)
    watchfile.write(d, spec["watch"])
    if spec.get("restart_command"):  # restart.command: what restarted attempts run (sh/run.sh)
        _write(os.path.join(d, p.RESTART_COMMAND), spec["restart_command"], 0o600)
    cfg = watchfile.parse(spec["watch"])
    if cfg.stacks != watchfile.STACKS_OFF or (cfg.job is not None and cfg.job.flight_recorder):
        os.mkdir(os.path.join(d, p.STACKS), 0o700)  # the training's faulthandler and each rank's recorder helper
    if spec.get("compile_guard"):  # launch.compile_guard: warmup and training run under the guard
        _write(os.path.join(d, p.COMPILE_GUARD), "1\n", 0o600)
    pointer = os.path.join(state, p.SESSIONS, spec["session"])
    _write(pointer + ".tmp", run_id + "\n", 0o644)
    os.replace(pointer + ".tmp", pointer)
    return d


def tool_prepare(argv: list) -> int:
    (run_id,) = argv
    spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    try:
        prepare(run_id, spec)
    except OSError as exc:
        sys.stderr.write("cannot create the run directory %s: %s\n" % (p.run_dir(run_id), exc.strerror or exc))
        return marks.CANNOT_CREATE_EXIT
    print(marks.mark("prepared", run_id))
    return 0


def tool_record(argv: list) -> int:
    run_id, name = argv
    if name not in REWRITABLE:
        sys.stderr.write("record: %s cannot be rewritten\n" % name)
        return 2
    record = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    try:
        write_json_atomic(os.path.join(p.run_dir(run_id), name), record)
    except OSError as exc:
        sys.stderr.write("cannot write %s: %s\n" % (name, exc.strerror or exc))
        return marks.CANNOT_CREATE_EXIT
    print(marks.mark("recorded", name))
    return 0


def append_event(d: str, event: str, **data: Any) -> None:
    """One line appended to the run's events.jsonl (O_APPEND: whole lines, whoever writes)."""
    import time

    record = {"schema_version": p.SCHEMA_VERSION, "ts": round(time.time(), 3), "event": event, "by": "watchdog", **data}
    fd = os.open(os.path.join(d, p.EVENTS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True, default=str) + "\n").encode())
    finally:
        os.close(fd)


def set_aside(d: str, name: str, aside: str) -> None:
    """Keep a record under another name, where it would say something untrue (no record: nothing to do)."""
    try:
        os.replace(os.path.join(d, name), os.path.join(d, aside))
    except OSError:
        pass
