"""The `gpuops` command: a thin click layer; each command imports the core only when it runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from gpuops import __version__
from gpuops.cli import complete
from gpuops.cli.options import boundary, common_options
from gpuops.cli.params import Seconds

all_option = click.option("--all", "every", is_flag=True, help="Every target of the inventory.")
SEVERAL = ("Several targets (-t repeated, a group, --all) run at once, each line tagged with its target; the exit "
           "code is the worst of theirs.")
junit_option = click.option("--junit", metavar="PATH", shell_complete=complete.files,
                            help="Also write a JUnit XML report to PATH for CI test pages "
                            "(testcases: preflight, each warmup GPU, training).")
report_option = click.option("--report", "html", metavar="FILE", shell_complete=complete.files,
                             help="Also write the run's report to FILE when it ends: one self-contained HTML page "
                             "(summary, plots of throughput, GPU memory and utilisation over the run's time).")


class Gpuops(click.Group):
    """The command group; click's own errors (usage) come in gpuops' one style: `gpuops: error: ...` + a hint."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        import sys

        from gpuops.cli.renderers.errors_view import show_click_error

        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):  # bare `gpuops`: the help
                exc.show()
                sys.exit(exc.exit_code)
            show_click_error(exc)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:  # Ctrl-C (or EOF at a prompt) before a command's own boundary
            from gpuops.errors import ExitCode

            sys.stderr.write("gpuops: interrupted\n")
            sys.exit(ExitCode.INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=Gpuops, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gpuops")
@click.option("-q", "--quiet", is_flag=True, help="Only errors and the final outcome (--json output is unchanged).")
def main(quiet: bool) -> None:
    """Run GPU training jobs in Proxmox LXC containers over SSH, and stop them the moment they go wrong.

    Exit codes: 0 ok, 1 internal error, 2 usage/config, 3 connect/host key, 4 preflight,
    5 warmup, 6 training failed, 7 aborted by a rule, 8 stalled, 9 notify-test failed, 10 a GPU failed
    (its hardware), 124 --timeout, 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP. Over several targets: the worst,
    143 > 129 > 130 > 141 > 1 > 10 > 7 > 8 > 6 > 5 > 4 > 9 > 3 > 2 > 124.
    """
    from gpuops.cli.renderers import style as looks

    looks.QUIET = quiet


@main.command(epilog=SEVERAL)
@common_options()
@all_option
@click.option("--detach", is_flag=True, help="Return once the run is started (exit 0).")
@click.option("--dry-run", is_flag=True, help="Print every command that would be sent, quoted exactly; connect to nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (for unattended use).")
@click.option("--timeout", type=Seconds(), help="Stop the run after SECONDS and exit 124.")
@click.option("--stop-on-exit", is_flag=True,
              help="If launch ends before its run (Ctrl-C, SIGTERM, SIGHUP, a connection given up on), stop the run "
              "first (as `gpuops stop`), then exit with the signal's code (CI: a cancelled job leaves no run).")
@junit_option
@report_option
@boundary
def launch(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, detach: bool, dry_run: bool, yes: bool,
           timeout: float | None, stop_on_exit: bool, junit: str | None, html: str | None, as_json: bool,
           verbose: bool) -> int:
    """Preflight, warm up GPU by GPU, start in tmux, then follow and abort on a fatal signature or a stall."""
    from gpuops.cli.commands.launch_cmd import run_launch
    from gpuops.cli.reports.both import Reports
    from gpuops.cli.reports.html.writer import HtmlReport
    from gpuops.cli.reports.junit import Report

    for flag, given in (("--junit", junit), ("--report", html)):
        if given and dry_run:
            raise click.UsageError(f"{flag} does not apply to --dry-run (nothing runs)")
    if stop_on_exit and detach:
        raise click.UsageError("--stop-on-exit does not go with --detach (launch ends before its run at once)")
    with HtmlReport(html, "launch", say=not as_json) as page, Report(junit, "launch", _one(targets)) as report:
        return run_launch(inventory, playbook, targets, every=every, detach=detach, dry_run=dry_run, yes=yes,
                          timeout=timeout, as_json=as_json, verbose=verbose, report=Reports(report, page),
                          stop_on_exit=stop_on_exit)


def _one(targets: tuple[str, ...]) -> str | None:
    """The report's default target name: the one given, if one was."""
    return targets[0] if len(targets) == 1 else None


@main.command()
@common_options()
@all_option
@click.option("--watch", "refresh_every", type=Seconds(), is_flag=False, flag_value=2.0, default=None,
              help="Refresh in place every N seconds (default 2).")
@boundary
def status(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, refresh_every: float | None,
           as_json: bool, verbose: bool) -> int:
    """Reachability, container state, GPUs (memory over the last minutes), tmux session, current run and its
    watchdog of each target."""
    from gpuops.cli.commands.status_cmd import run_status

    return run_status(inventory, playbook, targets, refresh_every=refresh_every, as_json=as_json, verbose=verbose,
                      every=every)


@main.command()
@common_options(verbose=False)
@all_option
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most N runs per target.")
@boundary
def runs(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, limit: int, as_json: bool) -> int:
    """The run history of each target, newest first: outcome, exit code, rule, warmup, steady throughput and GPU
    memory (with -p: that playbook's runs only)."""
    from gpuops.cli.commands.runs_cmd import run_runs

    return run_runs(inventory, playbook, targets, every=every, limit=limit, as_json=as_json)


@main.command()
@common_options(verbose=False)
@all_option
@boundary
def metrics(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, as_json: bool) -> int:
    """The Prometheus exposition of every run of the targets that goes on or ended within its keep_ended, for a
    script exporter or a cron job (with -p: that playbook's runs; --json: one object per run)."""
    from gpuops.cli.commands.metrics_cmd import run_metrics

    return run_metrics(inventory, playbook, targets, every=every, as_json=as_json)


@main.command(epilog=SEVERAL)
@common_options()
@all_option
@click.option("--run", "run_id", metavar="ID", shell_complete=complete.run_ids, help="That run of the playbook's session (an id from `gpuops runs`), "
              "not the current one.")
@click.argument("run_arg", metavar="[RUN]", required=False, shell_complete=complete.run_ids)
@click.option("-f", "--follow", is_flag=True, help="Stream the log live and apply the watch rules.")
@click.option("--tail", type=click.IntRange(min=0), default=None, help="Start from the last N lines.")
@click.option("--no-abort", is_flag=True, help="Report matches but never stop the run.")
@click.option("--timeout", type=Seconds(), help="With --follow: stop the run after SECONDS, exit 124.")
@click.option("--stacks", "stacks", is_flag=True, help="Print the thread stacks recorded before the run's abort "
              "(watch.stacks), not its log.")
@junit_option
@report_option
@boundary
def logs(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, run_arg: str | None, run_id: str | None,
         follow: bool, tail: int | None, no_abort: bool, timeout: float | None, stacks: bool, junit: str | None,
         html: str | None, as_json: bool, verbose: bool) -> int:
    """Print the current run's log (or run RUN's) as it is; --follow streams it and watches it."""
    from gpuops.cli.commands.logs_cmd import run_logs
    from gpuops.cli.reports.both import Reports
    from gpuops.cli.reports.html.writer import HtmlReport
    from gpuops.cli.reports.junit import Report

    run_id = _run_given(run_arg, run_id)
    if stacks:
        if follow or junit or tail is not None:
            raise click.UsageError("--stacks prints the recorded stacks; it does not go with --follow, --tail or --junit")
        from gpuops.cli.commands.stacks_cmd import run_stacks

        return run_stacks(inventory, playbook, targets, every=every, run_id=run_id, recorded=True, as_json=as_json,
                          verbose=verbose)
    for flag, given in (("--junit", junit), ("--report", html)):
        if given and not follow:
            raise click.UsageError(f"{flag} needs --follow (the report is of a run being watched; "
                                   "`gpuops report` writes one for any run)" if flag == "--report" else
                                   f"{flag} needs --follow (the report is of a run being watched)")
    with HtmlReport(html, "logs -f", say=not as_json) as page, Report(junit, "logs", _one(targets)) as report:
        return run_logs(inventory, playbook, targets, every=every, run_id=run_id, follow=follow, tail=tail,
                        no_abort=no_abort, timeout=timeout, as_json=as_json, verbose=verbose, report=Reports(report, page))


def _run_given(arg: str | None, option: str | None) -> str | None:
    """RUN as an argument or as --run (the same run if both)."""
    if arg is not None and option is not None and arg != option:
        raise click.UsageError(f"RUN {arg} and --run {option} name two runs: give one")
    return arg if arg is not None else option


@main.command(epilog=SEVERAL)
@common_options(verbose=False)
@all_option
@click.option("--window", type=Seconds(), default=None,
              help="Seconds of the host's kernel log to read for Xids (default: the playbook's preflight.xid_window, "
              "else 3600).")
@boundary
def health(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, window: float | None,
           as_json: bool) -> int:
    """Each GPU's health: ECC and row-remap counters, slowdown reasons, PCIe link, temperatures, the host's recent
    Xids, and a verdict (ok, warn, needs reset, needs service); exit 10 when a GPU needs a reset or service."""
    from gpuops.cli.commands.health_cmd import run_health

    return run_health(inventory, playbook, targets, every=every, window=window, as_json=as_json)


@main.command(epilog=SEVERAL)
@common_options()
@all_option
@click.argument("run_id", metavar="[RUN]", required=False, shell_complete=complete.run_ids)
@boundary
def stacks(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, run_id: str | None, as_json: bool,
           verbose: bool) -> int:
    """Every thread's stack of each Python process of the live run, now (py-spy or faulthandler); the run goes
    on. RUN: the current run's id, checked."""
    from gpuops.cli.commands.stacks_cmd import run_stacks

    return run_stacks(inventory, playbook, targets, every=every, run_id=run_id, recorded=False, as_json=as_json,
                      verbose=verbose)


@main.command(epilog=SEVERAL)
@common_options()
@all_option
@boundary
def stop(inventory: str | None, playbook: str | None, targets: tuple[str, ...], every: bool, as_json: bool, verbose: bool) -> int:
    """Abort the current run (signal, grace, kill the session and its processes); exit 0 once none is alive."""
    from gpuops.cli.commands.stop_cmd import run_stop

    return run_stop(inventory, playbook, targets, every=every, as_json=as_json, verbose=verbose)


@main.command("notify-test", epilog=SEVERAL)
@common_options()
@boundary
def notify_test(inventory: str | None, playbook: str | None, targets: tuple[str, ...], as_json: bool,
                verbose: bool) -> int:
    """Send a test notification through every `notify:` channel of the playbook, from the target; print what each
    answered (exit 9 when any failed)."""
    from gpuops.cli.commands.notify_cmd import run_notify_test

    return run_notify_test(inventory, playbook, targets, as_json=as_json, verbose=verbose)


@main.command()
@common_options(several=False, verbose=False)
@boundary
def validate(inventory: str | None, playbook: str | None, target: str | None, as_json: bool) -> int:
    """Check inventory and playbook files; exit 2 with FILE:LINE:COL on a bad one."""
    from gpuops.cli.commands.validate_cmd import run_validate

    return run_validate(inventory, playbook, target, as_json=as_json)


@main.command()
@common_options(several=False)
@click.argument("run_id", metavar="[RUN]", required=False, shell_complete=complete.run_ids)
@click.option("-o", "--output", metavar="FILE", shell_complete=complete.files,
              help="Where to write it (default: gpuops-report-RUN.html here).")
@boundary
def report(inventory: str | None, playbook: str | None, target: str | None, run_id: str | None, output: str | None,
           as_json: bool, verbose: bool) -> int:
    """Write a run's report (default: the session's current run): one self-contained HTML file with its summary
    and plots of throughput, GPU memory and utilisation over its time, marked with warmups, matches, aborts, restarts."""
    from gpuops.cli.commands.report_cmd import run_report

    return run_report(inventory, playbook, target, run_id=run_id, output=output, as_json=as_json, verbose=verbose)


@main.command()
def schema() -> None:
    """Print the JSON Schema (draft 2020-12) every object of every --json output validates against."""
    import json

    from gpuops.cli.renderers.json_schema import schema as build

    click.echo(json.dumps(build(), indent=2))


complete.use_fish_script()  # each option declares its own completion (common.py, above); fish needs its script
