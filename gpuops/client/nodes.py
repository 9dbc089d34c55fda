"""One training job over several targets (playbook `launch.nodes`), started by torchrun on each node.

The job is one run id on every node. Preflight runs on every node before anything starts (one
fails: none starts); warmup per node, nodes side by side unless two share a host (their GPUs are
one machine's: they take turns); then every node starts its watchdog and `torchrun --nnodes N
--node-rank R ...` in its tmux session. What ends the job everywhere is on the targets (the
engine's rendezvous and each node's watchdog, docs/torchrun.md); this module plans and starts it,
and reads the nodes' records back into the job's one outcome.
"""

from __future__ import annotations

import dataclasses
import queue
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

from gpuops.client.events import Event, Outcome
from gpuops.client.play import Play
from gpuops.command import Cmd, Raw
from gpuops.config.playbook_model import EnvVar, Playbook
from gpuops.errors import ConfigError, ExitCode, GpuopsError, RemoteError

T = TypeVar("T")
R = TypeVar("R")

#: What a node's command reads for its rendezvous id: the run id on attempt 1, <run>-a<N> on attempt N.
RDZV_ID_VAR = "GPUOPS_RDZV_ID"
ASYNC_ERRORS = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
COLLECTIVE_TIMEOUT = "GPUOPS_COLLECTIVE_TIMEOUT"
HEARTBEAT = "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"
#: Seconds the collective timeout sits above a job's stall timeout by default: the stall clock fires first, so the
#: watchdogs take every rank's stacks and recorder while all of them live (measured: each node's whole abort ended
#: within 3.4 s of the stall, the exchange waits 15 s at most; docs/torchrun.md), and the engine's own timeout ends
#: the hang 60 s later where no watchdog does.
COLLECTIVE_MARGIN = 60.0
#: The collective timeout of a job whose stall clock is off: NCCL's own default (pytorch#110901); gloo's is 30 min.
COLLECTIVE_NO_STALL = 600.0
#: NCCL's heartbeat monitor: how long after its watchdog stops it kills a rank that did not end (torch's default is
#: 30 min: Flyte measured about 2 h lost per failure with the defaults and set 300 s, flyteorg/flyte-sdk#698).
HEARTBEAT_DEFAULT = 300.0


@dataclass(frozen=True)
class Node:
    """One node of the job, as its run directory records it (meta.json `job`, watch.json `job`)."""

    rank: int
    nodes: tuple[str, ...]
    job_id: str
    endpoint: str  # node 0's address:port, as the other nodes reach it
    key: str = dataclasses.field(default="", repr=False)  # signs the job's end record (per run, never shown)

    def meta(self) -> dict[str, Any]:
        return {"id": self.job_id, "node_rank": self.rank, "nodes": list(self.nodes), "endpoint": self.endpoint}

    def watch(self) -> dict[str, Any]:
        return {**self.meta(), "node_name": self.nodes[self.rank], "key": self.key}


def is_job(plays: list[Play]) -> bool:
    """These plays are the nodes of one torchrun job (the playbook's launch.nodes, no -t)."""
    return bool(plays) and bool(plays[0].playbook.launch.nodes) and \
        [j.target.name for j in plays] == list(plays[0].playbook.launch.nodes)


def check_nodes(plays: list[Play]) -> None:
    """Every node is a target of the inventory (a ConfigError at the playbook's line, exit 2)."""
    if not plays:
        return
    pb, inv = plays[0].playbook, plays[0].inventory
    for name, mark in zip(pb.launch.nodes, pb.launch.node_marks or (None,) * len(pb.launch.nodes), strict=True):
        if name not in inv.targets:
            from gpuops.config.schema import suggest

            raise ConfigError(mark, f"launch.nodes names '{name}', which is not a target of {inv.path} "
                              f"(targets: {', '.join(inv.targets) or 'none'}){suggest(name, inv.targets)}", file=pb.path)


def known_address(play: Play) -> str | None:
    """Node 0's address as the other nodes reach it, when the inventory says it; None: ask the target."""
    if play.target.rdzv_address:
        return play.target.rdzv_address
    host = play.inventory.hosts[play.target.host]
    if play.target.ctid is not None:
        return None  # a container's own address is not the Proxmox host's: discovered at launch
    if host.transport == "local":
        return "127.0.0.1"
    return host.address or host.name


#: How node 0's address is found when the inventory does not say (a container): its first address.
ADDRESS_PROBE = Cmd("hostname", "-I")


def discover_address(play: Play) -> str:
    result = play.transport.run(ADDRESS_PROBE, timeout=play.timeout)
    words = result.out.split()
    if result.exit_code != 0 or not words:
        raise RemoteError(f"{play.target.name}: cannot find node 0's address (`hostname -I` exit {result.exit_code}: "
                          f"{(result.err or result.out).strip()[-200:] or 'no address'})",
                          hint=f"set rdzv_address for target '{play.target.name}' in the inventory")
    return words[0]


#: What --dry-run shows for node 0's address while it is asked of node 0 only at launch: one shell word.
DRY_ADDRESS = "NODE0_ADDRESS"


def endpoint(plays: list[Play], *, dry: bool = False) -> tuple[str, str]:
    """(node 0's address:port, how it was found)."""
    spec = plays[0].playbook.launch.torchrun
    assert spec is not None
    address = known_address(plays[0])
    how = "rdzv_address" if plays[0].target.rdzv_address else "the inventory"
    if address is None:
        address = DRY_ADDRESS if dry else discover_address(plays[0])
        how = f"`hostname -I` on {plays[0].target.name}"
    shown = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"{shown}:{spec.port}", how


def torchrun_command(pb: Playbook, rank: int, nnodes: int, rdzv_endpoint: str) -> str:
    """The node's training command: torchrun's arguments quoted, then the playbook's command as written."""
    spec = pb.launch.torchrun
    assert spec is not None
    head = Cmd("torchrun", "--nnodes", str(nnodes), "--node-rank", str(rank), "--nproc-per-node", str(spec.nproc_per_node),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", Raw(f'"${RDZV_ID_VAR}"'))
    return head.render() + " " + pb.launch.command


def collective_timeout(pb: Playbook) -> float:
    """torchrun.collective_timeout, else the stall timeout + COLLECTIVE_MARGIN (with stall_timeout auto: its initial
    timeout), else (no stall clock) COLLECTIVE_NO_STALL."""
    spec = pb.launch.torchrun
    if spec is not None and spec.collective_timeout is not None:
        return spec.collective_timeout
    stall = pb.watch.stall_timeout
    return stall + COLLECTIVE_MARGIN if stall > 0 else COLLECTIVE_NO_STALL


def node_env(pb: Playbook) -> tuple[EnvVar, ...]:
    """The playbook's env, plus what the job needs unless the env sets it: NCCL's async error handling, the collective
    timeout (gpuops' sitecustomize makes it the process group's default), NCCL's heartbeat, the Flight Recorder's
    buffer (neither name of it set: TORCH_FR_BUFFER_SIZE, or the older TORCH_NCCL_TRACE_BUFFER_SIZE)."""
    from gpuops.agent.wire.flight import BUFFER_DEFAULT, BUFFER_VAR, OLD_BUFFER_VAR

    spec = pb.launch.torchrun
    assert spec is not None
    names = {v.name for v in pb.env}
    extra = []
    if spec.async_error_handling and ASYNC_ERRORS not in names:
        extra.append(EnvVar(ASYNC_ERRORS, "1"))
    timeout = collective_timeout(pb)
    if COLLECTIVE_TIMEOUT not in names:
        extra.append(EnvVar(COLLECTIVE_TIMEOUT, f"{timeout:g}"))
    if HEARTBEAT not in names:
        extra.append(EnvVar(HEARTBEAT, f"{HEARTBEAT_DEFAULT:g}"))
    if spec.flight_recorder and not names & {BUFFER_VAR, OLD_BUFFER_VAR}:
        extra.append(EnvVar(BUFFER_VAR, str(BUFFER_DEFAULT)))
    return tuple(pb.env) + tuple(extra)


def node_plays(plays: list[Play], run_id: str, rdzv_endpoint: str, key: str | None = None) -> list[Play]:
    """Each node's play: the playbook with that node's torchrun command and env, and the node's place in the job."""
    key = key if key is not None else secrets.token_hex(16)
    names = tuple(j.target.name for j in plays)
    out = []
    for rank, play in enumerate(plays):
        pb = play.playbook
        launch = dataclasses.replace(pb.launch, command=torchrun_command(pb, rank, len(plays), rdzv_endpoint))
        mine = dataclasses.replace(pb, launch=launch, env=node_env(pb))
        out.append(dataclasses.replace(play, playbook=mine, node=Node(rank, names, run_id, rdzv_endpoint, key)))
    return out


def turns(plays: list[Play]) -> list[list[Play]]:
    """Nodes grouped by the machine their GPUs are on (the host): groups warm up side by side, a group's
    nodes one after another."""
    groups: dict[str, list[Play]] = {}
    for play in plays:
        groups.setdefault(play.target.host, []).append(play)
    return list(groups.values())


def side_by_side(groups: list[Any], work: Callable[[Any], Iterator[Event]]) -> Iterator[Event]:
    """Run `work(group)` for each group in a thread of its own and yield every event as it comes; the first
    error is raised once all have ended."""
    q: queue.Queue[Any] = queue.Queue()
    errors: list[BaseException] = []

    def one(group: Any) -> None:
        try:
            for ev in work(group):
                q.put(ev)
        except BaseException as exc:  # noqa: BLE001 - carried to the caller's thread
            errors.append(exc)
        finally:
            q.put(None)

    threads = [threading.Thread(target=one, args=(g,), daemon=True, name="gpuops-node") for g in groups]
    for t in threads:
        t.start()
    left = len(threads)
    while left:
        item = q.get()
        if item is None:
            left -= 1
        else:
            yield item
    if errors:
        raise next((e for e in errors if not isinstance(e, GpuopsError)), errors[0])


def each(items: Sequence[T], fn: Callable[[T], R]) -> list[R | BaseException]:
    """fn(item) for every node's item at once; the results in node order (an exception stands as the result)."""
    out: dict[int, R | BaseException] = {}

    def one(i: int) -> None:
        try:
            out[i] = fn(items[i])
        except BaseException as exc:  # noqa: BLE001 - returned, the caller decides
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [out[i] for i in range(len(items))]


# -- the job's one outcome, from its nodes' records ---------------------------------------------------------
@dataclass
class NodeEnd:
    name: str
    rank: int
    outcome: str
    exit_code: int | None
    abort: dict[str, Any] | None
    hang: dict[str, Any] | None = None  # a stalled job's verdict, as this node read it (abort-done.json `hang`)


def hang_of(ends: list[NodeEnd]) -> dict[str, Any] | None:
    """The job's verdict of where it hung: the one that names a collective (every node read the same summaries;
    a node whose link was gone read only its own)."""
    verdicts = [e.hang for e in ends if isinstance(e.hang, dict)]
    return next((v for v in verdicts if v.get("collective")), verdicts[0] if verdicts else None)


def first_failing(ends: list[NodeEnd]) -> NodeEnd | None:
    """The node whose failure ended the job: a stalled job's culprit (the node of the ranks that never arrived in
    the collective the others wait in: the one elsewhere, not the one whose clock fired first), else the one the
    others' job-abort records name, else the earliest abort, else the first node (by rank) that failed; None when
    every node succeeded."""
    by_name = {e.name: e for e in ends}
    culprit = (hang_of(ends) or {}).get("culprit_node")
    if culprit in by_name and by_name[culprit].exit_code not in (None, ExitCode.OK):
        return by_name[culprit]
    for e in ends:
        named = (e.abort or {}).get("first_node") if (e.abort or {}).get("reason") == "job" else None
        if named in by_name:
            return by_name[named]
    own = [e for e in ends if e.abort is not None and e.abort.get("reason") != "job"]
    if own:
        return min(own, key=lambda e: str((e.abort or {}).get("time") or ""))
    failed = [e for e in ends if e.exit_code not in (None, ExitCode.OK)]
    return failed[0] if failed else None


def job_outcome(run_id: str, ends: list[NodeEnd]) -> Outcome:
    """The job's summary: the first failing node's code, and that node named."""
    first = first_failing(ends)
    nodes = [{"node": e.name, "node_rank": e.rank, "outcome": e.outcome, "exit_code": e.exit_code} for e in ends]
    data: dict[str, Any] = {"run": run_id, "job": run_id, "nodes": nodes}
    each_said = ", ".join(f"{e.name} {e.outcome} (exit {e.exit_code})" for e in ends)
    if first is None:
        return Outcome("succeeded", ExitCode.OK, f"job {run_id}: every node succeeded: {each_said}", data)
    code = first.exit_code if first.exit_code is not None else ExitCode.TRAINING_FAILED
    rule = (first.abort or {}).get("rule")
    why = f" ({rule})" if rule else ""
    data.update({"first_failing_node": first.name, "node_rank": first.rank,
                 **({"rule": rule, "excerpt": (first.abort or {}).get("excerpt")} if rule else {})})
    hang = hang_of(ends)
    where = ""
    if hang is not None:
        data["hang"] = hang
        where = f"; the job hung: {hang.get('text')}"
    return Outcome(first.outcome, code, f"job {run_id} ended by node {first.name} (rank {first.rank}): "
                   f"{first.outcome}{why}{where}; {each_said}", data)
