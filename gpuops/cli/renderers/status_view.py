"""How `gpuops status` shows a target, drawn from its status data (client/status.py's TargetStatus):
plain lines when piped, rich renderables on a terminal. Each view reads the data, never the other's text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuops.agent.wire.jobwire import STORE_GONE
from gpuops.agent.wire.verdict import record_words

if TYPE_CHECKING:
    from rich.console import Group

    from gpuops.agent.wire.marks import ProbeReply, ProbeSession
    from gpuops.agent.wire.runinfo import RunInfo
    from gpuops.client.status import TargetStatus

_STOPPED_BY = {"watchdog": "the watchdog", "client": "a following client", "stop": "gpuops stop", "timeout": "--timeout"}


def node_words(job: Any) -> str:
    """A node's place in a torchrun job (meta.json `job`): 'node 0 of 2 (ct200, ct201)'; '' for a lone run."""
    if not isinstance(job, dict) or not isinstance(job.get("node_rank"), int):
        return ""
    nodes = [str(n) for n in job.get("nodes") or []]
    return f"node {job['node_rank']} of {len(nodes)} ({', '.join(nodes)})"


def job_stop_words(abort: Any) -> str:
    """Why a node of a job was stopped when another node ended the job: 'the job: ct201 (rank 1) matched X'."""
    if not isinstance(abort, dict) or abort.get("reason") != "job":
        return ""
    what = {"match": f"matched {abort.get('rule')}", "stall": "stalled"}.get(str(abort.get("first_reason")),
                                                                          f"ended ({abort.get('first_reason')})")
    if abort.get("first_by") == STORE_GONE:
        what = "went away (its rendezvous store was lost before the job's end)"
    return f"the job: node {abort.get('first_node')} (rank {abort.get('first_rank')}) {what} first"


def throughput_words(run: RunInfo) -> str:
    """The run's latest throughput figure against its baseline (from the watchdog's heartbeat)."""
    tele = (run.watchdog or {}).get("telemetry") or {}
    figure, base = tele.get("throughput"), (tele.get("baseline") or {}).get("throughput")
    if figure is None:
        return ""
    if not base:
        return f"; throughput {figure:,.0f} (no baseline yet)"
    where = f" of run {tele['baseline']['run']}" if (tele.get("baseline") or {}).get("run") else ""
    return f"; throughput {figure:,.0f} = {figure / base:.2f}x the baseline {base:,.0f}{where}"


def watchdog_words(run: RunInfo) -> str:
    """The run's watchdog in a few words: alive and how fresh, done, or gone while the run goes on."""
    live = run.state in ("running", "aborting", "restarting")
    age = run.watchdog_age
    if run.watchdog is None:
        return "; no watchdog (only a following client guards it)" if live else ""
    if run.watchdog.get("state") == "done":
        return "; watchdog done"
    restarts = run.watchdog.get("restarts") or 0
    again = f", restarted {restarts}x" if restarts else ""
    wait = str(run.watchdog.get("wait") or "")
    polling = f", polling the log: {wait[len('poll ('):-1]}" if wait.startswith("poll (") else ""
    if run.watchdog_alive:
        return f"; watchdog alive (heartbeat {age:.1f}s ago{again}{polling})"
    if live:
        return (f"; WATCHDOG GONE (last heartbeat {age:.0f}s ago): nothing guards the run; "
                "`gpuops logs -f` watches it" if age is not None else "; WATCHDOG GONE")
    return ""


def session_words(s: ProbeSession) -> str:
    """One tmux session: alive or not, a launch in progress, its run, how it ended, its watchdog."""
    text = f"session {s.session} {'alive' if s.alive else 'not running'}"
    if s.locked_by:
        text += f"; launch in progress ({s.locked_by})"
    if not s.run:
        return text
    ago = s.run.seconds_since_log
    text += f"; run {s.run.run_id} {s.run.state}"
    node = node_words(s.run.meta.get("job"))
    text += f", {node}" if node else ""
    maximum = (s.run.watchdog or {}).get("max_attempts") or 1
    if maximum > 1 or s.run.attempts > 1:
        text += f" (attempt {s.run.attempts} of {maximum})"
    code = s.run.outcome_code()
    unstarted = (s.run.watchdog or {}).get("start_failed")  # the attempt's warmup or drain failed: it never ran
    if code is not None:  # gpuops' exit code, and the command's own status where it differs
        said = None if unstarted else s.run.exit_code
        text += f" (exit {code}" + (f"; command exited {said}" if said is not None and said != code else "") + ")"
    if unstarted:
        text += f"; attempt {s.run.attempts} failed to start: {unstarted}"
    if ago is not None:
        text += f"; log grew {ago:.0f}s ago"
    rule = (s.run.abort or {}).get("rule")
    by = (s.run.abort or {}).get("by")
    if s.run.hardware is not None:  # the GPU that ended it: the Xid or counter, NVIDIA's action
        text += f"; HARDWARE: {record_words(s.run.hardware)}"
        rule = None if rule == s.run.hardware.get("rule") else rule
    if job_stop_words(s.run.abort):  # stopped because another node of the job ended it
        text += f"; stopped with {job_stop_words(s.run.abort)}"
    else:
        text += f"; matched {rule}" if rule else ""
        text += f"; stopped by {_STOPPED_BY.get(by, by)}" if by else ""
    hang = (s.run.abort_done or {}).get("hang")
    if isinstance(hang, dict) and hang.get("text"):  # a stalled torchrun job: where it hung, as every node read it
        text += f"; the job hung: {hang['text']}"
    text += throughput_words(s.run) if s.alive else ""
    return text + guard_words(s.run) + watchdog_words(s.run) + host_log_words(s.run)


def host_log_words(run: RunInfo) -> str:
    """The host's kernel-log follower: what it follows with, or why it does not; the Xids it handed over."""
    log = run.host_kernel_log
    if log is None:
        return ""
    xids = "".join(f"; Xid {x.get('code')} ({x.get('name')}) on GPU {x.get('index')}" for x in log["xids"][-3:])
    if log["state"] == "following":
        return f"; host kernel log followed ({log.get('reader')}, host pid {log.get('host_pid')}){xids}"
    if log["state"] == "ended":
        return f"; host kernel log was followed ({log.get('reader')}){xids}"
    return ""  # not followed: the launch said why, and status --json's host_kernel_log says it


def guard_words(run: RunInfo) -> str:
    """The compile guard's counts: first calls it serialized, seconds they took and others waited."""
    g = run.compile_guard
    if g is None:
        return ""
    if not g["processes"]:
        return "; compile guard on (nothing compiled yet)"
    procs = f", {g['processes']} processes" if g["processes"] > 1 else ""
    return (f"; compile guard: {g['serialized']} first calls serialized ({g['first_call_s']:.1f}s), "
            f"{g['waited_s']:.1f}s waited{procs}")


def head_words(r: TargetStatus) -> str:
    """The target's first line: unreachable and why, or how it was reached."""
    if r.error:
        return f"unreachable: {r.error}"
    return f"reachable via {r.host}" + (f", container {r.ctid} {r.container}" if r.ctid is not None else "")


def notes(r: TargetStatus) -> tuple[list[str], list[str]]:
    """The target's other lines, those before its GPUs (a hint, nvidia-smi's state) and those after (tmux, runs)."""
    if r.error:
        return ([f"hint: {r.hint}"] if r.hint else []), []
    probe = r.probe
    if probe is None:
        return [], []
    before = []
    if probe.smi == "absent":
        before.append("no nvidia-smi on this target (no GPUs to show)")
    elif probe.smi == "error":
        before.append(f"nvidia-smi failed: {probe.smi_error}")
    after = [] if probe.tmux else ["tmux is not installed"]
    after += [session_words(s) for s in probe.sessions.values()]
    if not probe.sessions:
        after.append("no gpuops runs")
    return before, after


def _memory(history: dict[int, tuple[list[int | None], float]], index: int) -> str:
    """A GPU's memory over the last minutes as a sparkline and its shape; '' without samples."""
    from gpuops.cli.renderers.spark import shape, sparkline

    series, swing = history.get(index, ([], 0.0))
    return f"{sparkline(series, 30, min_span=256)} {shape(series, swing)}" if series else ""


def _history(probe: ProbeReply) -> dict[int, tuple[list[int | None], float]]:
    from gpuops.client.status import memory_history

    return memory_history(probe)


def plain_lines(r: TargetStatus) -> list[str]:
    """Every line prefixed by its target, so output from many targets stays greppable."""
    p = f"{r.target}:"
    before, after = notes(r)
    lines = [f"{p} {head_words(r)}"] + [f"{p} {n}" for n in before]
    probe = r.probe if not r.error else None
    if probe is not None:
        history = _history(probe)
        for g in probe.gpus:
            procs = ", ".join(f"{x.pid}:{x.name}:{x.used_mib}MiB" for x in g.processes) or "-"
            util = "?" if g.utilization_pct is None else f"{g.utilization_pct}%"
            line = f"{p} gpu {g.index} {g.memory_used_mib}/{g.memory_total_mib} MiB util {util} procs {procs}"
            memory = _memory(history, g.index)
            lines.append(line + (f" memory {memory}" if memory else ""))
    return lines + [f"{p} {n}" for n in after]


def rich_view(results: list[TargetStatus]) -> Group:
    """The status as rich renderables; every text is a rich Text, so `[host]:port` or `:name:` is never markup."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for r in results:
        head = Table.grid(padding=(0, 1))
        head.add_row(Text(r.target, style="bold"), Text(" " + head_words(r)))
        parts.append(head)
        before, after = notes(r)
        probe = r.probe if not r.error else None
        if probe is not None and probe.gpus:
            history = _history(probe)
            t = Table(show_edge=False, pad_edge=False)
            for col in ("GPU", "memory used", "total", "util", "processes") + (("memory, last minutes",) if history else ()):
                t.add_column(col)
            for g in probe.gpus:
                cells = [str(g.index), f"{g.memory_used_mib} MiB", f"{g.memory_total_mib} MiB",
                         "?" if g.utilization_pct is None else f"{g.utilization_pct}%",
                         ", ".join(f"{x.pid} {x.name} {x.used_mib} MiB" for x in g.processes) or "-"]
                if history:
                    cells.append(_memory(history, g.index))
                t.add_row(*(Text(c) for c in cells))
            parts.append(t)
        parts.extend(Text("  " + n.strip()) for n in before + after)
    return Group(*parts)
