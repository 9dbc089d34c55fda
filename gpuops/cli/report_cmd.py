"""`gpuops report [RUN]`: one run's report (default: the session's current run) as a self-contained HTML file,
read from the target's run directory in one round trip, so it works from any machine and for any run."""

from __future__ import annotations

import sys
import time

from gpuops.errors import ExitCode


def run_report(inventory: str | None, playbook: str | None, target: str | None, *, run_id: str | None,
               output: str | None, as_json: bool, verbose: bool) -> int:
    from gpuops.cli.options import report_cost
    from gpuops.cli.report.page import write
    from gpuops.cli.report.writer import build, check_writable, fetch
    from gpuops.cli.targets import load_jobs
    from gpuops.cli.which_run import check_run_id

    if run_id is not None:
        check_run_id(run_id)
    if output:
        check_writable(output, "-o")
    (job,) = load_jobs(inventory, playbook, (target,) if target else (), need_env=False)
    try:
        record = fetch(job, run_id)
    finally:
        report_cost(verbose, [job.transport])
        job.transport.close()
    run = str(record.get("run"))
    path = output or f"gpuops-report-{run}.html"
    if not output:
        check_writable(path, "-o")
    text = build([(job.target.name, record, {}, "", "", job.mask)], "gpuops report")
    write(path, text)
    profile = record.get("profile") or {}
    if as_json:
        from gpuops.cli.render import iso, json_line

        sys.stdout.write(json_line({"ts": iso(time.time()), "event": "report", "target": job.target.name, "run": run,
                                    "path": path, "outcome": profile.get("outcome"), "exit_code": profile.get("exit_code"),
                                    "plots": text.count("<svg")}) + "\n")
    else:
        sys.stderr.write(f"gpuops: the report of run {run} ({profile.get('outcome') or 'running'}) is in {path}\n")
    return ExitCode.OK
