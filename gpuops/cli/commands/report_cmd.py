"""`gpuops report [RUN]`: one run's report (default: the session's current run) as a self-contained HTML file,
read from the target's run directory in one round trip, so it works from any machine and for any run."""

from __future__ import annotations

import sys
import time

from gpuops.errors import ExitCode


def run_report(inventory: str | None, playbook: str | None, target: str | None, *, run_id: str | None,
               output: str | None, as_json: bool, verbose: bool) -> int:
    from gpuops.cli.flows.which_run import check_run_id
    from gpuops.cli.options import report_cost
    from gpuops.cli.reports.html.page import write
    from gpuops.cli.reports.html.writer import build, fetch
    from gpuops.cli.reports.writable import check_writable
    from gpuops.client.selection import load_plays

    if run_id is not None:
        check_run_id(run_id)
    if output:
        check_writable(output, "-o")
    # One target, or every node of a torchrun job (the playbook's launch.nodes): one lane each, one page.
    plays = load_plays(inventory, playbook, (target,) if target else (), need_env=False)
    records = []
    try:
        for play in plays:
            records.append(fetch(play, run_id))
    finally:
        report_cost(verbose, [play.transport for play in plays])
        for play in plays:
            play.transport.close()
    run = str(records[0].get("run"))
    path = output or f"gpuops-report-{run}.html"
    if not output:
        check_writable(path, "-o")
    text = build([(play.target.name, record, {}, "", "", play.mask) for play, record in zip(plays, records, strict=True)],
                 "gpuops report")
    write(path, text)
    profiles = [record.get("profile") or {} for record in records]
    if as_json:
        from gpuops.cli.renderers.render import iso, json_line

        for play, record, profile in zip(plays, records, profiles, strict=True):
            sys.stdout.write(json_line({"ts": iso(time.time()), "event": "report", "target": play.target.name,
                                        "run": str(record.get("run")), "path": path, "outcome": profile.get("outcome"),
                                        "exit_code": profile.get("exit_code"), "plots": text.count("<svg")}) + "\n")
    else:
        outcomes = ", ".join(f"{play.target.name} {p.get('outcome') or 'running'}"
                             for play, p in zip(plays, profiles, strict=True))
        sys.stderr.write(f"gpuops: the report of run {run} ({outcomes if len(plays) > 1 else profiles[0].get('outcome') or 'running'}) "
                         f"is in {path}\n")
    return ExitCode.OK
