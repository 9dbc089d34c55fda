"""The JSON Schema (draft 2020-12) of everything `--json` prints: one `$defs` entry per event kind.

`gpuops schema` prints it; docs/json.md says what each field means; the test suite checks every
line any `--json` prints in it against this schema. Every event object is closed
(`additionalProperties: false`), so a field nobody documented fails the tests instead of
reaching users unannounced. Nested records the agent writes (the abort record, telemetry,
detector figures) are described by their known fields and stay open: they are the target's
records, documented in docs/remote-state.md.
"""

from __future__ import annotations

from typing import Any

from gpuops.agent.wire.channel_list import kinds as channel_kinds
from gpuops.agent.wire.detector_list import DETECTORS
from gpuops.agent.wire.detector_list import notes as detector_notes
from gpuops.agent.wire.detector_list import rules as detector_rules
from gpuops.agent.wire.protocol import NOTIFY_TEST, NOTIFY_WHATS, SCHEMA_VERSION, WATCHDOG_NOTES, RunState

Schema = dict[str, Any]

S: Schema = {"type": "string"}
I: Schema = {"type": "integer"}
N: Schema = {"type": "number"}
B: Schema = {"type": "boolean"}
OBJ: Schema = {"type": "object"}


def opt(schema: Schema) -> Schema:
    """The schema, or null."""
    return {"anyOf": [schema, {"type": "null"}]}


def arr(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def closed(props: dict[str, Schema], required: tuple[str, ...] = ()) -> Schema:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


def by_gpu(value: Schema) -> Schema:
    """An object keyed by GPU index (JSON keys are strings)."""
    return {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": value}


#: What every object carries.
COMMON: dict[str, Schema] = {
    "ts": {"type": "string", "format": "date-time"},
    "target": S,
    "run": {"type": "string", "pattern": "^[0-9a-z-]{1,64}$"},
    "schema_version": {"const": SCHEMA_VERSION},
}
WHO = {"enum": ["watchdog", "client", "stop", "timeout", "pane"]}
VERDICT = {"enum": ["ok", "warn", "needs reset", "needs service"]}
REASON = {"enum": ["match", "stall", "stop", "timeout", "interrupt", "job"]}  # job: another node of a torchrun job ended it
EXIT = {"type": "integer", "minimum": 0, "maximum": 255}
NOTIFY_VIA = {"enum": list(channel_kinds())}  # a channel's kind (wire/channel_list.py)

#: Nested shapes shared by several events.
SHAPES: dict[str, Schema] = {
    "gpu_drained": {"type": "object", "properties": {"index": I, "memory_used_mib": opt(I)}, "required": ["index"]},
    "gpu_finding": closed({"index": I, "memory_used_mib": opt(I), "utilization_pct": opt(I), "processes": I,
                           "problems": arr(S), "bus_id": opt(S), "uuid": opt(S), "verdict": opt(VERDICT),
                           "health": arr(ref("health_problem"))}, ("index",)),
    # The GPUs' own health (docs/health.md): one cause of a GPU's verdict, with NVIDIA's recommended action.
    "health_problem": closed({"counter": S, "value": {}, "level": VERDICT, "message": S, "action": S},
                             ("counter", "level", "message", "action")),
    # A GPU as every health message names it.
    "gpu_id": closed({"index": opt(I), "bus_id": opt(S), "uuid": opt(S)}, ("index",)),
    # An Xid of the host's kernel log, classified by NVIDIA's Xid catalog (agent/wire/xid_catalog.json).
    "xid": {"type": "object", "properties": {
        "code": I, "name": opt(S), "resolution": opt(S), "line": opt(S), "t": opt(N), "bus": S, "message": S,
        "pid": opt(I), "process": opt(S), "meaning": S, "hardware": B, "action": S, "level": VERDICT, "index": opt(I),
        "bus_id": opt(S)}, "required": ["code"]},
    # hardware.json as a run's readers carry it: the GPU fault that ended the run (exit 10, outcome hardware).
    "hardware": closed({"rule": opt(S), "gpu": ref("gpu_id"), "xid": opt(ref("xid")), "counter": opt(S), "value": {},
                        "message": opt(S), "action": opt(S), "instead_of": opt(S), "restart_blocked": S},
                       ("rule", "gpu", "xid", "counter", "message", "action")),
    # gpuops health: one GPU, its counters and its verdict.
    "health_gpu": closed({
        "index": opt(I), "bus_id": opt(S), "uuid": opt(S), "name": opt(S), "verdict": VERDICT,
        "problems": arr(ref("health_problem")), "ecc_mode": opt(S),
        "ecc": opt(closed({"uncorrected_volatile": opt(I), "corrected_volatile": opt(I), "uncorrected_aggregate": opt(I)})),
        "retired_pages_pending": opt(B),
        "remapped_rows": opt(closed({"correctable": opt(I), "uncorrectable": opt(I), "pending": opt(B), "failure": opt(B)})),
        "clocks_event_reasons": arr(S),
        "link": opt(closed({"gen": opt(I), "gen_max": opt(I), "width": opt(I), "width_max": opt(I)})),
        "temperature": opt(closed({"gpu": opt(N), "memory": opt(N)})), "power": opt(closed({"draw": opt(N), "limit": opt(N)})),
        "recovery_action": opt(S), "errors": OBJ, "lost": opt(S), "xids": arr(ref("xid")),
    }, ("index", "verdict", "problems")),
    "gpu_status": closed({
        "index": I, "memory_used_mib": opt(I), "memory_total_mib": opt(I), "utilization_pct": opt(I),
        "processes": arr(closed({"pid": opt(I), "used_mib": opt(I), "name": opt(S)})),
        "memory_history_mib": arr(opt(I)), "memory_shape": {"enum": ["flat", "volatile"]},
    }, ("index",)),
    "abort_record": {"type": "object", "properties": {
        "reason": REASON, "by": WHO, "rule": opt(S), "line": opt(S), "excerpt": opt(S), "time": S, "signal": S,
        "grace": N, "pid": I, "seconds": N, "stall_timeout": N, "last_line": opt(S), "log_missing": B}},
    "attempt_ended": {"type": "object", "properties": {
        "attempt": I, "compile_guard": B, "outcome": S, "exit_code": opt(EXIT), "command_exit_code": opt(I),
        "rule": opt(S), "by": opt(S), "line": opt(S), "excerpt": opt(S), "started": opt(N), "ended": opt(N)}},
    "run_status": closed({
        "id": S, "session": S, "state": {"enum": [s.value for s in RunState]}, "attempts": I, "max_attempts": I,
        "exit_code": opt(EXIT), "command_exit_code": opt(I), "started_at": opt(S), "playbook": opt(S),
        "seconds_since_log": opt(N), "log_bytes": opt(I), "abort": opt(ref("abort_record")), "stopped_by": opt(S),
        "job": opt(closed({"id": S, "node_rank": I, "nodes": arr(S), "endpoint": opt(S)})),
        "last_match": opt(S), "watchdog": opt(closed({
            "alive": B, "heartbeat_age": opt(N), "state": opt(S), "restarts": opt(I), "disabled_rules": arr(S),
            "wait": opt(S)})),
        "telemetry": opt(OBJ), "compile_guard": opt(OBJ),
        "hang": ref("hang_verdict"), "hardware": opt(ref("hardware")),
        "host_kernel_log": opt(closed({"state": S, "why": opt(S), "reader": opt(S), "host_pid": opt(I),
                                       "xids": arr(OBJ)}, ("state",))),
    }, ("id", "session", "state", "exit_code", "command_exit_code")),
    "connection": closed({
        "name": S, "host": S, "address": opt(S), "port": opt(I), "user": opt(S), "jumps": arr(S),
        "identity_file": opt(S), "known_hosts": opt(S), "host_key_policy": opt(S), "ctid": opt(I), "gpus": arr(I),
        "transport": {"enum": ["local", "ssh"]}, "proxy_command": S,
        "jump_host_key_policies": arr(opt(S)), "become_user": opt(S),
        "become_method": opt({"enum": ["runuser", "sudo", "su"]}),
    }, ("name", "host", "transport", "address", "port", "user", "jumps", "ctid", "gpus")),
    "broken_target": closed({"name": S, "error": S}, ("name", "error")),
    # One Python process's thread stacks (the abort record's `stacks`, the summary's): where they are kept
    # in the run directory (null: it did not answer, `error` says why), how many threads, taken how.
    "stack_process": closed({"pid": I, "file": opt(S), "threads": I, "via": opt({"enum": ["py-spy", "faulthandler"]}),
                             "attempt": I, "error": S,
                             "rank": I, "local_rank": I}, ("pid", "file", "threads", "via")),
    # Where a stalled torchrun job hung (gpuops/agent/wire/hang.py): the collective, who waits, who never came.
    "hang_verdict": closed({
        "source": opt({"enum": ["flight-recorder", "stacks"]}), "text": S, "notes": arr(S),
        "collective": closed({"seq": I, "op": S, "pg": S, "pg_desc": S, "backend": S, "sizes": {}, "timeout_ms": I}),
        "waiting": arr(closed({"rank": I, "node": S}, ("rank", "node"))),
        "missing": arr(closed({"rank": I, "node": S, "last": opt(I), "where": S}, ("rank", "node"))),
        "unknown": arr(I), "culprit_node": opt(S), "culprit_rank": I,
    }, ("text",)),
    "job_node": closed({"node": S, "node_rank": I, "outcome": S, "exit_code": opt(EXIT)}, ("node", "node_rank", "outcome")),
    # The quiet-failure detectors' rules (a `match` with `figures`, a run's `findings`) and notes (a `watchdog`
    # `note`), from gpuops/agent/wire/detector_list.py: each names its playbook key under watch:.
    "detector_rule": {"enum": list(detector_rules()), "description": "; ".join(
        f"{', '.join(d.rules)}: watch.{d.key}, {d.doc}" for d in DETECTORS)},
    "detector_note": {"enum": list(detector_notes())},
}

#: Each event kind's own fields (beside COMMON) and the ones it always has.
EVENTS: dict[str, tuple[dict[str, Schema], tuple[str, ...]]] = {
    # -- launch --------------------------------------------------------------------------------
    "preflight_ok": ({"gpus": arr(ref("gpu_finding")), "smi": {"enum": ["ok", "absent", "error"]},
                      "host_kernel_log": closed({"reader": opt(S), "why": opt(S)})}, ("gpus",)),
    "gpu_health": ({"gpu": opt(I), "bus_id": opt(S), "uuid": opt(S), "verdict": VERDICT,
                    "problems": arr(ref("health_problem"))}, ("gpu", "verdict", "problems")),
    "host_kernel_log": ({"state": {"enum": ["following", "off"]}, "why": S, "reader": opt(S), "host_pid": opt(I),
                         "gpus": arr(I)}, ("state",)),
    "lock_recovered": ({"holder": opt(S)}, ()),
    "run_created": ({"session": S, "node_rank": I}, ("run", "session")),
    "job_planned": ({"job": S, "nodes": arr(S), "rdzv_endpoint": S, "found_by": S}, ("run", "job", "nodes", "rdzv_endpoint")),
    "warmup_start": ({"gpu": I}, ("gpu",)),
    "warmup_output": ({"gpu": I, "line": S}, ("gpu", "line")),
    "warmup_draining": ({"gpu": I, "memory_used_mib": opt(I)}, ("gpu",)),
    "warmup_done": ({"gpu": I, "seconds": N}, ("gpu", "seconds")),
    "started": ({"session": S, "log": S, "warmup_seconds": by_gpu(N), "watchdog": B, "node_rank": I, "command": S},
                ("run", "session", "log")),
    # -- following a run (launch, logs -f) -------------------------------------------------------
    "waiting_start": ({"phase": opt(S)}, ("run",)),
    "following": ({"state": opt(S)}, ("run",)),
    "log": ({"line": S, "offset": I}, ("line",)),
    "log_reset": ({"why": S, "by": WHO}, ()),
    "log_missing": ({"log": S}, ("log",)),
    "match": ({
        "rule": S, "action": {"enum": ["abort", "warn", "note"]}, "description": opt(S), "line": opt(S),
        "line_number": opt(I), "offset": opt(I), "excerpt": opt(S), "by": WHO, "advice": opt(S), "message": opt(S),
        "figures": opt(OBJ),
    }, ("rule", "action", "by")),
    "stall": ({"seconds": N, "stall_timeout": N, "by": WHO, "log_missing": B, "stall": OBJ}, ("seconds", "stall_timeout")),
    "rule_disabled": ({"rule": S, "seconds": N, "by": WHO, "message": S}, ("rule", "seconds")),
    "watchdog_stale": ({"age": opt(N), "stale_after": N}, ("age",)),
    "watchdog_back": ({"age": N}, ("age",)),
    "watchdog": ({
        "what": {"enum": list(WATCHDOG_NOTES)},
        "by": WHO, "message": S, "rule": opt(S), "advice": opt(S), "figures": opt(OBJ), "restarts": I, "delay": N,
        "signal": I, "exit": opt(I), "frozen": N, "offset": I, "stopped_by": opt(S), "reason": opt(S), "attempt": I,
        "max_attempts": opt(I), "compile_guard": B, "held_by": opt(by_gpu(arr(I))), "state": S, "first_node": opt(S),
        "first_rank": opt(I), "first_reason": opt(S), "first_by": opt(S), "exit_code": opt(EXIT), "excerpt": opt(S),
    }, ("what",)),
    "restart": ({"attempt": I, "max_attempts": I, "after": S, "compile_guard": B, "delay": N, "warmup": B,
                 "previous": ref("attempt_ended"), "by": WHO}, ("attempt", "max_attempts", "after", "compile_guard")),
    "unknown_event": ({"name": S, "record": OBJ, "newer": B}, ("name", "record")),
    "newer_run": ({"version": I, "this_version": I}, ("version", "this_version")),
    "reconnecting": ({"error": S, "attempt": I}, ("error", "attempt")),
    "reconnected": ({"offset": I}, ("offset",)),
    "timeout": ({}, ()),
    # -- stopping (launch, logs -f, stop) ------------------------------------------------------------
    "abort_start": ({"reason": REASON, "rule": opt(S), "by": WHO, "phase": opt(S),
                     "verdict_pending": B}, ("reason",)),
    "aborted": ({
        "reason": REASON, "rule": opt(S), "by": opt(WHO), "survivors": arr(I), "gpus": arr(ref("gpu_drained")),
        "held_by": opt(by_gpu(arr(I))), "seconds": N, "session_gone_at": opt(N), "time": S,
        "stacks": arr(ref("stack_process")),
        "hang": ref("hang_verdict"), "verdict_pending": B,
    }, ("reason", "survivors", "gpus", "seconds")),
    # -- stacks, logs --stacks ------------------------------------------------------------------------
    "stacks": ({"pid": I, "file": opt(S), "threads": I, "via": opt({"enum": ["py-spy", "faulthandler"]}),
                "attempt": I, "error": S, "text": S,
                "rank": I, "local_rank": I}, ("run", "pid", "file", "threads", "via", "text")),
    "stopped_elsewhere": ({"reason": opt(S), "stopped_by": opt(S), "rule": opt(S), "by": WHO}, ("stopped_by",)),
    "survivors": ({"pids": arr(I), "by": WHO}, ("pids",)),
    # -- notifications (playbook `notify:`, docs/notify.md) -------------------------------------------
    "notify": ({
        "what": {"enum": [*NOTIFY_WHATS, NOTIFY_TEST]}, "playbook": S, "outcome": S, "exit_code": opt(EXIT),
        "rule": opt(S), "excerpt": opt(S), "attempt": I, "max_attempts": I, "text": S, "by": opt(S),
        "command_exit_code": opt(I), "stacks": arr(ref("stack_process")), "restart_failed": S,
        "hang": ref("hang_verdict"),
        "hardware": ref("hardware"),
    }, ("run", "what", "playbook", "outcome", "exit_code", "rule", "excerpt", "attempt", "max_attempts", "text")),
    "notify_sent": ({
        "what": {"enum": [*NOTIFY_WHATS, NOTIFY_TEST]}, "channel": I, "via": NOTIFY_VIA, "status": I, "exit": I,
        "tries": I, "seconds": N, "output": S, "by": WHO,
    }, ("what", "channel", "via")),
    "notify_failed": ({
        "what": {"enum": [*NOTIFY_WHATS, NOTIFY_TEST]}, "channel": opt(I), "via": NOTIFY_VIA, "status": I, "exit": I,
        "reason": S, "tries": I, "seconds": N, "output": S, "by": WHO,
    }, ("what", "reason")),
    # -- launch --dry-run ------------------------------------------------------------------------------
    "dry_run_step": ({"step": S, "command": S, "stdin": S}, ("step", "command")),
    # -- status, runs --------------------------------------------------------------------------------------
    "status": ({
        "host": S, "ctid": opt(I), "reachable": B, "error": opt(S), "hint": opt(S), "container": opt(S),
        "nvidia_smi": opt({"enum": ["ok", "absent", "error"]}), "nvidia_smi_error": opt(S),
        "gpus": arr(ref("gpu_status")),
        "sessions": arr(closed({"session": S, "alive": B, "launch_in_progress": opt(S), "run": opt(ref("run_status"))},
                               ("session", "alive", "run"))),
    }, ("host", "reachable", "gpus", "sessions")),
    "run": ({
        "playbook": opt(S), "session": opt(S), "started": opt(S), "ended": opt(S), "duration_s": opt(N),
        "warmup_seconds": by_gpu(N), "outcome": S, "exit_code": opt(EXIT), "command_exit_code": opt(I),
        "rule": opt(S), "by": opt(S), "settle": N, "findings": arr(ref("detector_rule")), "error": opt(S),
        "throughput": opt(OBJ), "gpus": by_gpu(OBJ), "samples": I, "digest": opt(S), "attempts": I,
        "job": opt(OBJ), "hardware": ref("hardware"),
    }, ("run", "outcome", "exit_code", "command_exit_code")),
    # -- gpuops health ---------------------------------------------------------------------------------------
    "health": ({
        "host": S, "ctid": opt(I), "reachable": B, "error": opt(S), "hint": opt(S), "verdict": opt(VERDICT),
        "gpus": arr(ref("health_gpu")), "nvidia_smi": opt({"enum": ["ok", "absent", "error"]}),
        "nvidia_smi_error": opt(S), "refused_fields": arr(S),
        "kernel_log": opt(closed({"reader": opt(S), "why": opt(S), "window": N})),
    }, ("host", "reachable", "gpus")),
    # -- gpuops metrics (docs/metrics.md): one run's snapshot, as the exposition renders it --------------------
    "metrics": ({
        "playbook": S, "node": S, "node_rank": opt(I), "session": S, "state": {"enum": [s.value for s in RunState]},
        "attempt": I, "max_attempts": I, "started_at": opt(N), "ended_at": opt(N), "exit_code": opt(EXIT),
        "command_exit_code": opt(I), "throughput": opt(N), "throughput_baseline": opt(N),
        "throughput_min_ratio": opt(N), "log_silence_seconds": opt(N), "stall_timeout_seconds": opt(N),
        "heartbeat_at": opt(N), "heartbeat_age_seconds": opt(N),
        "aborts": {"type": "object", "additionalProperties": I}, "restarts": {"type": "object", "additionalProperties": I},
        "matches": arr(closed({"rule": S, "action": S, "count": I}, ("rule", "action", "count"))),
        "notifications": arr(closed({"what": S, "via": S, "sent": I, "failed": I}, ("what", "via", "sent", "failed"))),
        "gpus": arr(closed({"gpu": I, "uuid": S, "memory_used_mib": opt(N), "utilization_pct": opt(N),
                            "processes": opt(I), "memory_baseline_mib": opt(N),
                            "health": {"type": "object", "additionalProperties": N}}, ("gpu", "uuid"))),
    }, ("run", "playbook", "state", "attempt", "max_attempts", "exit_code", "aborts", "restarts", "matches",
        "notifications", "gpus")),
    # -- gpuops report -------------------------------------------------------------------------------------
    "report": ({"path": S, "outcome": opt(S), "exit_code": opt(EXIT), "plots": I}, ("run", "path", "plots")),
    # -- the last line of launch, logs, stop, validate --------------------------------------------------------
    "summary": ({
        "outcome": S, "exit_code": EXIT, "message": S,
        "command_exit_code": opt(I), "rule": opt(S), "line": opt(S), "excerpt": opt(S), "by": opt(S),
        "gpus": {"anyOf": [arr(ref("gpu_finding")), arr(ref("gpu_drained"))]}, "survivors": arr(I),
        "last_line": opt(S), "container": S, "run_alive": opt(B), "attempts": I, "earlier_attempts": arr(ref("attempt_ended")),
        "stacks": arr(ref("stack_process")),
        "error": S, "hint": S, "thresholds": OBJ, "gpu": I, "output_tail": arr(S),
        "checked": arr(S), "unset_env": arr(S), "warnings": arr(S), "targets": arr({"anyOf": [ref("connection"), ref("broken_target")]}),
        "job": S, "nodes": {"anyOf": [arr(S), arr(ref("job_node"))]}, "first_failing_node": S, "node_rank": I, "detached": B,
        "hang": ref("hang_verdict"),
        "hardware": ref("hardware"),
    }, ("outcome", "exit_code", "message")),
}


def schema() -> Schema:
    """The whole schema: an object is exactly one of the event definitions, picked by its `event`."""
    assert not set(SHAPES) & set(EVENTS), "a shape and an event of one name: $defs holds one of them"
    defs: dict[str, Schema] = dict(SHAPES)
    for kind, (props, required) in EVENTS.items():
        defs[kind] = closed({**COMMON, "event": {"const": kind}, **props},
                            tuple(dict.fromkeys(("ts", "event", "target", "schema_version") + required)))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:gpuops:json:{SCHEMA_VERSION}",
        "title": "gpuops --json output",
        "description": "One JSON object per line; `event` names its definition (docs/json.md).",
        "type": "object",
        "required": ["event"],
        "properties": {"event": {"enum": list(EVENTS)}},
        "discriminator": {"propertyName": "event"},
        "oneOf": [ref(kind) for kind in EVENTS],
        "$defs": defs,
    }
