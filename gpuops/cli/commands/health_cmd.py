"""`gpuops health`: each GPU of a target (or of a playbook's run) with its counters, slowdown reasons, link,
temperatures and the host's recent Xids, and a verdict per GPU: ok, warn, needs reset, needs service.

Plain lines, each prefixed by its target (greppable over many targets), or one `health` object per target with
--json. Exit 0 when every GPU shown may run, 10 when one needs a reset or service, 3 when a target could not be
read (the worst over several targets)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from gpuops.errors import worst_exit

if TYPE_CHECKING:
    from gpuops.client.health_report import TargetHealth


def run_health(inventory: str | None, playbook: str | None, names: tuple[str, ...], *, every: bool, window: float | None,
               as_json: bool) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from gpuops.client.health_report import read_target
    from gpuops.client.selection import select_targets
    from gpuops.transport import Pool

    sel = select_targets(inventory, playbook, names, every)
    inv, pb = sel.inventory, sel.playbook
    gpus = None
    if pb is not None:
        gpus = tuple(dict.fromkeys([*pb.preflight.gpus, *(pb.warmup.gpus if pb.warmup else ())]))
        window = pb.preflight.xid_window if window is None else window
    pool = Pool(inv)
    try:
        with ThreadPoolExecutor(max_workers=min(8, len(sel.targets))) as ex:
            results = list(ex.map(lambda t: read_target(pool, inv, t, gpus or None, window or 3600.0), sel.targets))
    finally:
        pool.close()
    for r in results:
        if as_json:
            from gpuops.cli.renderers.render import iso, json_line

            sys.stdout.write(json_line({"ts": iso(time.time()), "event": "health", **r.as_json()}) + "\n")
        else:
            sys.stdout.write("".join(f"{r.target}: {line}\n" for line in lines(r)))
    sys.stdout.flush()
    return worst_exit(r.exit_code for r in results)


def lines(r: TargetHealth) -> list[str]:
    """A target's GPUs in words: each GPU's line, then each cause with NVIDIA's action."""
    if r.error:
        return [f"unreachable: {r.error}"] + ([f"hint: {r.hint}"] if r.hint else [])
    if r.health is None:
        return ["no nvidia-smi on this target (no GPUs to judge)" if r.smi == "absent" else
                f"nvidia-smi failed: {r.smi_error}"]
    xids = r.health.xids
    out = [f"host kernel log: Xids of the last {r.window:g} s read with {xids.reply.reader}" if xids.readable and xids.reply
           else f"host kernel log not read ({xids.why}): Xids are not judged"]
    out += [f"this driver does not know {f}: not read" for f in r.health.refused]
    for g in r.shown:
        out += _gpu_lines(r.gpu_json(g))
    for v in r.health.unplaced:
        out += [f"GPU ? ({v.bus_id}): {v.level.upper()}"] + [f"  {p.message}; NVIDIA: {p.action}" for p in v.problems]
    return out


def _gpu_lines(g: dict[str, Any]) -> list[str]:
    who = ", ".join(str(x) for x in (g.get("bus_id"), g.get("uuid")) if x)
    head = f"GPU {g.get('index')} ({who}): {str(g.get('verdict')).upper()}"
    if g.get("lost"):
        return [head, f"  {g['lost']}"] + [f"  {p['message']}; NVIDIA: {p['action']}" for p in g["problems"][1:]]
    ecc, rows, link = g.get("ecc") or {}, g.get("remapped_rows") or {}, g.get("link") or {}
    temp = g.get("temperature") or {}
    head += (f"; ECC uncorrected {ecc.get('uncorrected_volatile')} (lifetime {ecc.get('uncorrected_aggregate')}), "
             f"corrected {ecc.get('corrected_volatile')}; rows remapped {rows.get('correctable')}/{rows.get('uncorrectable')}"
             f" pending {_yn(rows.get('pending'))} failed {_yn(rows.get('failure'))}; clocks "
             f"{', '.join(g.get('clocks_event_reasons') or []) or 'unslowed'}; PCIe gen {link.get('gen')}/{link.get('gen_max')}"
             f" x{link.get('width')}/x{link.get('width_max')}; {_num(temp.get('gpu'))} C (memory {_num(temp.get('memory'))} C)"
             f"; recovery action {g.get('recovery_action')}")
    out = [head]
    out += [f"  Xid {x['code']} ({x.get('name')}){_at(x.get('t'))}: {x.get('resolution')}" for x in g.get("xids") or []]
    out += [f"  {p['level'].upper()}: {p['message']} ({p['counter']}); NVIDIA: {p['action']}" for p in g["problems"]]
    return out


def _yn(value: Any) -> str:
    return "-" if value is None else ("Yes" if value else "No")


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def _at(t: Any) -> str:
    return "" if not isinstance(t, (int, float)) else time.strftime(" at %Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
