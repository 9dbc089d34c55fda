"""`gpuops health` in words: a target's GPUs as plain lines (greppable, each prefixed by its target) or, on a
terminal, a table per target with each GPU's causes and NVIDIA's action under it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Group

    from gpuops.client.health_report import TargetHealth

#: A verdict's look on a terminal (NO_COLOR drops the colours: style.console).
#: What the table's figures are (under it).
CAPTION = ("ECC: uncorrected/corrected errors since the driver loaded; remap: rows remapped correctable/uncorrectable; "
           "°C: GPU/memory")
LOOKS = {"ok": "green", "warn": "yellow", "needs reset": "bold red", "needs service": "bold red"}


def lines(r: TargetHealth) -> list[str]:
    """A target's GPUs in words: each GPU's line, then each cause with NVIDIA's action."""
    if r.error:
        return [f"unreachable: {r.error}"] + ([f"hint: {r.hint}"] if r.hint else [])
    if r.health is None:
        return ["no nvidia-smi on this target (no GPUs to judge)" if r.smi == "absent" else
                f"nvidia-smi failed: {r.smi_error}"]
    out = [kernel_log_words(r)]
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


def kernel_log_words(r: TargetHealth) -> str:
    xids = r.health.xids if r.health is not None else None
    if xids is not None and xids.readable and xids.reply:
        return f"host kernel log: Xids of the last {r.window:g} s read with {xids.reply.reader}"
    return f"host kernel log not read ({xids.why if xids is not None else 'no GPUs'}): Xids are not judged"


def rich_view(results: list[TargetHealth]) -> Group:
    """Each target: its head, a table of its GPUs (verdict; uncorrected/corrected ECC errors since the driver
    loaded; rows remapped correctable/uncorrectable, pending or failed; clock-event reasons; the PCIe link; GPU/memory
    temperature), then each cause with NVIDIA's action, wrapped to the terminal. Every text is a rich Text (never
    markup)."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    def indented(text: str, style: str = "") -> Padding:
        return Padding(Text(text, style=style), (0, 0, 0, 2))  # wrapped lines keep the indent

    parts: list[Any] = []
    for r in results:
        parts.append(Text(r.target, style="bold"))
        if r.error or r.health is None:
            parts.extend(indented(line) for line in lines(r))
            continue
        parts.append(indented(kernel_log_words(r)))
        parts.extend(indented(f"this driver does not know {f}: not read") for f in r.health.refused)
        t = Table(show_edge=False, pad_edge=False, caption=CAPTION, caption_justify="left")
        for col, wrap in (("GPU", False), ("verdict", True), ("ECC", False), ("remap", False), ("clocks", True),
                          ("PCIe", False), ("°C", False)):
            t.add_column(col, no_wrap=not wrap, overflow="fold",  # a long reason name folds, never cut
                         min_width=len("gpu_idle") if col == "clocks" else None)
        causes: list[Padding] = []
        for index in r.shown:
            g = r.gpu_json(index)
            verdict = str(g.get("verdict"))
            look = Text(verdict, style=LOOKS.get(verdict, ""))
            if g.get("lost"):
                t.add_row(Text(str(index)), look, *(Text("-") for _ in range(5)))
                causes.append(indented(f"GPU {index}: {g['lost']}", LOOKS.get(verdict, "")))
            else:
                ecc, rows, link = g.get("ecc") or {}, g.get("remapped_rows") or {}, g.get("link") or {}
                temp = g.get("temperature") or {}
                t.add_row(Text(str(index)), look,
                          Text(f"{_num(ecc.get('uncorrected_volatile'))}/{_num(ecc.get('corrected_volatile'))}"),
                          Text(f"{_num(rows.get('correctable'))}/{_num(rows.get('uncorrectable'))}"
                               + (" pending" if rows.get("pending") else "") + (" FAILED" if rows.get("failure") else "")),
                          Text(", ".join(g.get("clocks_event_reasons") or []) or "unslowed"),
                          Text(_link(link)), Text(f"{_num(temp.get('gpu'))}/{_num(temp.get('memory'))}"))
            who = ", ".join(str(x) for x in (g.get("bus_id"), g.get("uuid")) if x)
            for x in g.get("xids") or []:
                causes.append(indented(f"GPU {index} ({who}): Xid {x['code']} ({x.get('name')}){_at(x.get('t'))}: "
                                       f"{x.get('resolution')}"))
            for p in g["problems"]:
                causes.append(indented(f"GPU {index} ({who}) {p['level'].upper()}: {p['message']} ({p['counter']}); "
                                       f"NVIDIA: {p['action']}", LOOKS.get(p["level"], "")))
        parts.append(t)
        parts.extend(causes)
        for v in r.health.unplaced:
            parts.append(indented(f"GPU ? ({v.bus_id}): {v.level.upper()}", LOOKS.get(v.level, "")))
            parts.extend(indented(f"  {p.message}; NVIDIA: {p.action}") for p in v.problems)
    return Group(*parts)


def _link(link: dict[str, Any]) -> str:
    """`gen5 x16` at its maximum, else what it runs at against its maximum (`gen4/5 x8/16`: degraded)."""
    gen = f"{_num(link.get('gen'))}" + ("" if link.get("gen") == link.get("gen_max") else f"/{_num(link.get('gen_max'))}")
    width = f"{_num(link.get('width'))}" + ("" if link.get("width") == link.get("width_max")
                                             else f"/{_num(link.get('width_max'))}")
    return f"gen{gen} x{width}"
