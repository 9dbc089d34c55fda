"""The one abort sequence: claim, signal, grace, kill the session, reap every process of the run, drain.

Whoever stops a run (the watchdog, a following client, `gpuops stop`, `--timeout`) goes through
``claim``: abort.json is created with os.link, which only one caller can win, so a run is
signalled once and has one record saying why and by whom. The losers wait for the winner's
abort-done.json. `python3 -m gpuops_agent abort RUN_ID BY` (the record on stdin) is how a
client runs it; it survives the client's connection dropping mid-way.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .. import SH
from ..system import tmux
from ..system.procs import parents, run_of, running, started_at
from ..wire import marks, watchfile
from ..wire import protocol as p
from ..wire.records import read_json, write_json_atomic
from ..wire.smi import APP_FIELDS, GPU_FIELDS, SmiError, parse_gpus, parse_sample, sample_argv
from ..wire.watchfile import WatchConfig
from .attempt import current as current_attempt
from .attempt import due as restart_due
from .attempt import finish_step, moved_on, step_lock
from .prepare import append_event

DRAIN_TIMEOUT = 30.0
POLL = 0.02
#: An unreadable abort.json older than this, with nobody running the sequence, has a dead claimer.
CLAIM_SETTLE = 5.0
#: A stop that lost to an attempt's abort waits this long at most for the watchdog's restart decision.
RESTART_SETTLE = 15.0


def claim(d: str, record: Dict[str, Any]) -> Tuple[bool, Dict[str, Any]]:
    """Create abort.json with this record unless another stop got there first: (won, the record in force)."""
    path = os.path.join(d, p.ABORT)
    tmp = "%s.claim.%d.%d" % (path, os.getpid(), time.monotonic_ns())
    text = json.dumps(p.versioned(record), sort_keys=True, separators=(",", ":")) + "\n"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:  # a full disk: the claim is an empty abort.json (no data block), its record written if it can be
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return _claim_empty(path, text, record)
    try:
        os.link(tmp, path)
        return True, record
    except FileExistsError:
        return False, read_json(path) or {}
    finally:
        os.unlink(tmp)


def _claim_empty(path: str, text: str, record: Dict[str, Any]) -> Tuple[bool, Dict[str, Any]]:
    """The claim made with O_EXCL, which only one caller can win, as os.link does; an empty abort.json is
    a stop's (attempt.ended_by: never restarted) and a claimer's pid-less record (claimer_dead waits)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False, read_json(path) or {}
    try:
        os.write(fd, text.encode("utf-8"))
    except OSError:
        pass
    finally:
        os.close(fd)
    return True, record


def reap(run_id: str, term_wait: float = 3.0) -> List[int]:
    """Kill what is left of the run (sh/kill_marked.sh); the pids that survived SIGKILL."""
    out = subprocess.run(["bash", os.path.join(SH, "kill_marked.sh"), run_id, "%g" % term_wait],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode()
    return marks.parse_kill_marked(out)


def gpu_state(gpus: List[int]) -> Optional[Dict[int, Tuple[Optional[int], Optional[int]]]]:
    """Memory and utilisation of the run's GPUs now; None without a usable nvidia-smi."""
    try:
        result = subprocess.run(sample_argv(gpus), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    try:
        return parse_sample(result.stdout.decode("utf-8", "replace"))
    except SmiError:
        return None


def drain(gpus: List[int], max_mib: int, timeout: float = DRAIN_TIMEOUT,
          beat: Optional[Callable[[], None]] = None) -> List[Dict[str, Any]]:
    """Wait until the run's GPUs are back under the idle threshold (or the timeout); their state then.
    `beat`: called each poll (a watchdog's heartbeat: draining is no freeze)."""
    if not gpus:
        return []
    deadline = time.monotonic() + timeout
    while True:
        if beat is not None:
            beat()
        state = gpu_state(gpus)
        if state is None:
            return []
        busy = [g for g, (mem, _) in state.items() if mem is not None and mem > max_mib]
        if not busy or time.monotonic() >= deadline:
            return [{"index": g, "memory_used_mib": mem, "utilization_pct": util} for g, (mem, util) in sorted(state.items())]
        time.sleep(0.1)


@contextlib.contextmanager
def _sequence_lock(d: str, wait: bool) -> Iterator[bool]:
    """The abort sequence's lock (held while it runs, freed by the kernel when its holder dies): True if held."""
    try:
        fh = open(os.path.join(d, p.ABORT_LOCK), "a")
    except OSError:  # no lock file (a full disk): the sequence runs unguarded, as it is idempotent
        yield True
        return
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        fh.close()


def claimer_dead(d: str) -> bool:
    """The run's abort was claimed and not finished, and its claimer is gone: nobody holds the sequence's
    lock, and the claimer's process is not running (or abort.json is unreadable and not fresh)."""
    if not claimer_dead_unlocked(d):
        return False
    with _sequence_lock(d, wait=False) as free:
        return free


def finish_orphan(d: str, cfg: Optional[WatchConfig]) -> Optional[Dict[str, Any]]:
    """Finish an abort whose claimer died (no second signal: kill, reap, drain); None when there is none
    or another finisher has it."""
    with _sequence_lock(d, wait=False) as got:
        if not got or not claimer_dead_unlocked(d):
            return None
        result = _sequence(d, cfg)
    result["finished_for"] = str((read_json(os.path.join(d, p.ABORT)) or {}).get("by") or "?")
    return result


def claimer_dead_unlocked(d: str) -> bool:
    """claimer_dead, for a caller that holds the lock already."""
    path = os.path.join(d, p.ABORT)
    if not os.path.exists(path) or os.path.exists(os.path.join(d, p.ABORT_DONE)):
        return False
    pid = (read_json(path) or {}).get("pid")
    if isinstance(pid, int) and pid > 0:
        return pid != os.getpid() and not running(pid)
    try:
        return time.time() - os.stat(path).st_mtime >= CLAIM_SETTLE
    except OSError:
        return False


def gpu_holders(gpus: List[int]) -> Dict[int, List[int]]:
    """GPU index -> pids of the compute processes nvidia-smi lists on it ({} where it lists none, as in LXC)."""
    try:
        listed = [subprocess.run(["nvidia-smi", "--query-%s=%s" % q, "--format=csv,noheader,nounits"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 timeout=30).stdout.decode("utf-8", "replace")
                  for q in (("gpu", GPU_FIELDS), ("compute-apps", APP_FIELDS))]
        table = parse_gpus(listed[0], listed[1])
    except (OSError, subprocess.SubprocessError, SmiError):
        return {}
    return {g.index: [a.pid for a in g.processes if a.pid] for g in table if g.index in gpus and g.processes}


def drain_or_name(d: str, gpus: List[int], max_mib: int, beat: Optional[Callable[[], None]] = None,
                  ) -> Tuple[List[Dict[str, Any]], Dict[str, List[int]]]:
    """Drain the run's GPUs; a GPU that does not drain is held by someone: a holder that started after the
    run and carries no other run's marker is the run's own (a worker that escaped the reap) and is
    killed; the pids that still hold a GPU then are named, per GPU. `beat`: as drain's."""
    state = drain(gpus, max_mib, beat=beat)
    busy = [g["index"] for g in state if (g.get("memory_used_mib") or 0) > max_mib]
    if not busy:
        return state, {}
    since = _made_at(d)
    run_id = os.path.basename(d)
    ours = [pid for pids in gpu_holders(busy).values() for pid in pids if _escaped(pid, run_id, since)]
    for pid in ours:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if ours:
        state = drain(gpus, max_mib, timeout=10.0, beat=beat)
        busy = [g["index"] for g in state if (g.get("memory_used_mib") or 0) > max_mib]
    holders = gpu_holders(busy) if busy else {}
    return state, {str(g): holders.get(g, []) for g in busy}


def _escaped(pid: int, run_id: str, since: Optional[float]) -> bool:
    """A GPU holder that is the run's own, escaped from the reap: started after the run, marked by no
    other run, and orphaned (a double fork left init its parent). A job someone started from a shell
    meanwhile has a live parent and is not touched."""
    if since is None or run_of(pid) not in (None, run_id) or (started_at(pid) or 0) < since:
        return False
    return parents().get(pid) == 1


def _made_at(d: str) -> Optional[float]:
    """When the run was made (its command file is written once, by prepare)."""
    try:
        return os.stat(os.path.join(d, p.COMMAND)).st_mtime - 1.0
    except OSError:
        return None


def stop_run(d: str, cfg: Optional[WatchConfig], gather: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Signal the session's foreground job, wait the grace, kill the session, reap, drain; write abort-done.json.
    `gather`: a torchrun job's node summaries, through the watchdog's job link (run/before_signal.py)."""
    with _sequence_lock(d, wait=True):
        return _sequence(d, cfg, gather)


def _sequence(d: str, given: Optional[WatchConfig], gather: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    started = time.monotonic()
    cfg = run_config(d, given)
    session = cfg.session
    name, grace = cfg.abort.signal, cfg.abort.grace
    run_id = os.path.basename(d)
    stacks = verdict = None
    if _session_live(d, session, run_id):
        # A sequence finishing another's (its claimer died in the grace) sends no second signal: a
        # trainer that saves a checkpoint on the first Ctrl-C may take a second one for "quit now".
        sent_at = _signalled(d)
        if sent_at is None:
            from .before_signal import take

            stacks, verdict = take(d, cfg, run_id, gather)
            if name == "INT":
                tmux.interrupt(session)
            else:
                tmux.signal_foreground(session, getattr(signal, "SIG" + name))
            sent_at = time.time()
            _retry_write(lambda: _write_text(os.path.join(d, p.ABORT_SIGNALLED), "%.3f\n" % sent_at), tries=5)
        deadline = time.monotonic() + max(0.0, sent_at + grace - time.time())
        while time.monotonic() < deadline and not tmux.gone(session, run_id):
            time.sleep(POLL)
        tmux.kill(session)
    gone_at = time.time()
    survivors = reap(run_id)
    gpus, held_by = drain_or_name(d, list(cfg.gpus), cfg.max_memory_used_mib)
    result = {"survivors": survivors, "gpus": gpus, **({"held_by": held_by} if held_by else {}), "seconds": round(time.monotonic() - started, 3),
              "session_gone_at": gone_at, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              **({"stacks": stacks} if stacks is not None else {}), **({"hang": verdict} if verdict is not None else {})}
    _retry_write(lambda: write_json_atomic(os.path.join(d, p.ABORT_DONE), result))
    return result


def run_config(d: str, cfg: Optional[WatchConfig] = None) -> WatchConfig:
    """watch.json's settings; where it is garbled, what meta.json says (session, GPUs): a broken record
    never blocks a stop."""
    cfg = cfg or watchfile.parse({})
    if not cfg.session:
        meta = read_json(os.path.join(d, p.META)) or {}
        cfg = watchfile.with_session(cfg, str(meta.get("session") or ""),
                                     tuple(int(g) for g in meta.get("gpus") or ()))
    return cfg


def _session_live(d: str, session: str, run_id: str) -> bool:
    """The run's session is there to signal: tmux says so, or tmux failed on a started run that is
    not confirmed gone (a tmux error never skips the grace). A launch still warming up has none."""
    if not session:
        return False
    said = tmux.state(session)
    if said != tmux.UNSURE:
        return said == tmux.ALIVE
    return os.path.exists(os.path.join(d, p.STARTED)) and not tmux.gone(session, run_id)


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _retry_write(write: Callable[[], None], tries: int = 1200, every: float = 0.5) -> bool:
    """A record written once it can be (a full disk is transient): True once written."""
    for _ in range(tries):
        try:
            write()
            return True
        except OSError:
            time.sleep(every)
    return False


def _signalled(d: str) -> Optional[float]:
    """When this run's abort signal was sent, if it was."""
    try:
        with open(os.path.join(d, p.ABORT_SIGNALLED)) as fh:
            return float(fh.read().strip())
    except (OSError, ValueError):
        return None


def wait_done(d: str, timeout: float) -> Optional[Dict[str, Any]]:
    """The winner's abort-done.json once it is there (None past the timeout)."""
    deadline = time.monotonic() + timeout
    path = os.path.join(d, p.ABORT_DONE)
    while time.monotonic() < deadline:
        done = read_json(path)
        if done is not None:
            return done
        time.sleep(0.05)
    return None


def wait_or_finish(d: str, cfg: WatchConfig, timeout: float,
                   moved_on: Callable[[], bool] = lambda: False) -> Optional[Dict[str, Any]]:
    """The winner's abort-done.json; if the winner died before it (in the grace), finish its sequence.
    None at once when `moved_on` (a restart moved the attempt's records away)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not moved_on():
        done = wait_done(d, 0.25)
        if done is not None:
            return done
        finished = finish_orphan(d, cfg)
        if finished is not None:
            return finished
    return None


def _say(line: str) -> None:
    """Tell the client, if it is still there: a dropped connection must not stop the abort."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass


def tool_abort(argv: List[str]) -> int:
    """abort RUN_ID BY, the record (reason, rule, excerpt ..., masked by the client) on stdin."""
    run_id, by = argv
    for sig in (signal.SIGHUP, signal.SIGPIPE, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    d = p.run_dir(run_id)
    record = json.loads(sys.stdin.buffer.read().decode("utf-8") or "{}")
    cfg = run_config(d, watchfile.read(d))
    if not cfg.abort_written:  # no watch.json (or an old one): the signal and grace the stopper sent
        cfg = replace(cfg, abort=watchfile.Abort(str(record.get("signal") or watchfile.ABORT_SIGNAL),
                                                 float(record.get("grace", watchfile.ABORT_GRACE))))
    record.update({"by": by, "pid": os.getpid()})
    grace = cfg.abort.grace
    done: Optional[Dict[str, Any]] = None
    for _ in range(3):  # claimed again when the abort it lost to was an attempt's that the watchdog restarts
        with step_lock(d):  # never between a restart's publication of attempt n+1 and its filing of attempt n
            finish_step(d, lambda event, **data: append_event(d, event, **data))
            attempt = current_attempt(d)["attempt"]
            won, current = claim(d, record)
        if won:
            # A launch still warming up has no session yet: the sequence then reaps its warmup.
            _say(marks.mark("claimed", json.dumps(current, sort_keys=True)))
            done = stop_run(d, cfg)
            break
        done = wait_or_finish(d, cfg, grace + 90.0, functools.partial(moved_on, d, attempt))
        if not _restarted_meanwhile(d, cfg, attempt):
            _say(marks.mark("already", json.dumps(current, sort_keys=True)))
            break
    _say(marks.mark("aborted", json.dumps(done or {}, sort_keys=True)))
    return 0


def _restarted_meanwhile(d: str, cfg: WatchConfig, attempt: int) -> bool:
    """The abort this stop lost to was an attempt's that the watchdog restarts (or is about to): the stop
    must claim the next attempt's abort, or the run would go on."""
    settle = time.monotonic() + RESTART_SETTLE
    while time.monotonic() < settle and not moved_on(d, attempt) and restart_due(d, cfg) is not None:
        time.sleep(POLL)
    return moved_on(d, attempt)
