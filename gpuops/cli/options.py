"""Shared CLI pieces: common options, the cost report and the one error boundary."""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable

import click

from gpuops.cli import complete
from gpuops.errors import ExitCode

if TYPE_CHECKING:
    from gpuops.client.events import Outcome
    from gpuops.transport.base import Transport

inventory_option = click.option("-i", "--inventory", envvar="GPUOPS_INVENTORY", type=str, metavar="PATH",
                                shell_complete=complete.files, help="Inventory file (env GPUOPS_INVENTORY).")
playbook_option = click.option("-p", "--playbook", envvar="GPUOPS_PLAYBOOK", type=str, metavar="PATH",
                               shell_complete=complete.files, help="Playbook file (env GPUOPS_PLAYBOOK).")
json_option = click.option("--json", "as_json", is_flag=True, help="JSON Lines on stdout, nothing else there.")
verbose_option = click.option("-v", "--verbose", is_flag=True, help="Say more.")


def _quiet(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        from gpuops.cli import style as looks

        looks.QUIET = True


#: -q after the command too (`gpuops launch -q`), as before it (`gpuops -q launch`).
quiet_option = click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_quiet,
                            help="Only errors and the final outcome (as `gpuops -q`).")


def target_option(multiple: bool = False) -> Callable[[Any], Any]:
    """-t: one target (completed from the inventory's targets), or repeatable (its groups too)."""
    return click.option(
        "-t", "--target", "targets" if multiple else "target", multiple=multiple, envvar="GPUOPS_TARGET",
        metavar="NAME", shell_complete=complete.targets_and_groups if multiple else complete.target_names,
        help="Target name from the inventory (env GPUOPS_TARGET)" + (", repeatable." if multiple else "."),
    )


def common_options(*, several: bool = True, verbose: bool = True) -> Callable[[Any], Any]:
    """Every command's shared options, declared once: -i, -p, -t first, --json (and -v) last, the command's own
    options between them. Put it right under `@main.command`; `several`: -t repeatable."""
    head = [inventory_option, playbook_option, target_option(several)]
    tail = [json_option] + ([verbose_option] if verbose else []) + [quiet_option]

    def apply(fn: Any) -> Any:
        own = list(reversed(getattr(fn, "__click_params__", [])))  # click keeps them last-declared first
        fn.__click_params__ = []
        for option in reversed(head + tail):
            option(fn)
        declared = list(reversed(fn.__click_params__))
        fn.__click_params__ = list(reversed(declared[:len(head)] + own + declared[len(head):]))
        return fn

    return apply


def report_cost(verbose: bool, transports: Iterable[Transport]) -> None:
    """With -v: how many SSH connections and remote commands (round trips) this invocation made."""
    if not verbose:
        return
    conns = sum(t.connections_made for t in transports)
    cmds = sum(t.commands for t in transports)
    sys.stderr.write(f"gpuops: {conns} SSH connection(s), {cmds} remote command(s)\n")
    for client in sorted(getattr(sys.modules.get("gpuops.transport"), "clients_used", ())):
        sys.stderr.write(f"gpuops: SSH connections through {client}\n")
    resolver = sys.modules.get("gpuops.transport.ssh.resolve")
    for reader in sorted(getattr(resolver, "readers_used", ())):
        sys.stderr.write(f"gpuops: ssh configuration resolved by {reader}\n")


def crash_report() -> str:
    """Write the current exception's traceback to a new file (0600, made exclusively, never through a link) in a
    private folder of this user's (0700, every folder above it checked: $TMPDIR/gpuops-<uid>/crash, else
    ~/.cache/gpuops/crash); return its path. Raises what kept it from being written."""
    import tempfile
    import time
    import traceback

    from gpuops.localfiles import UnsafeFolder, private_folder

    refused = []
    for choice in (os.path.join(tempfile.gettempdir(), f"gpuops-{os.getuid()}", "crash"),
                   os.path.join(os.path.expanduser("~"), ".cache", "gpuops", "crash")):
        try:
            folder = private_folder(choice)
            break
        except UnsafeFolder as exc:
            refused.append(str(exc))
    else:
        raise UnsafeFolder("; ".join(refused))
    fd, path = tempfile.mkstemp(dir=folder, prefix=f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-",
                                suffix=".txt")  # O_CREAT | O_EXCL | O_NOFOLLOW, 0600
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
        fh.write(f"gpuops {' '.join(sys.argv[1:])}\n\n")
        traceback.print_exc(file=fh)
    return path


def _say_connect_retries() -> None:
    """A connect failure that is retried is said on stderr as it happens (not under -q): the transport
    logs it, and a person waiting 30 s for a host that is down sees why."""
    import logging

    from gpuops.cli import style

    log = logging.getLogger("gpuops.transport.connect")
    if style.QUIET or any(getattr(h, "gpuops", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.gpuops = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.propagate = False


def boundary(fn: Callable[..., int]) -> Callable[..., None]:
    """Run a command; map every error to one message and its exit code (the only place that does)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        from gpuops.cli.signals import Terminated, sigterm_as_interrupt
        from gpuops.errors import GpuopsError

        as_json = kwargs.get("as_json", False)
        _say_connect_retries()
        try:
            with sigterm_as_interrupt():  # a cancelled CI job, a closed terminal: as Ctrl-C, exit 143 or 129
                code = fn(*args, **kwargs)
        except GpuopsError as exc:
            code = exc.exit_code
            _report(as_json, code, "error", str(exc), getattr(exc, "hint", None), exc)
        except Terminated as exc:  # SIGTERM, SIGHUP
            code = exc.exit_code
            _report(as_json, code, exc.word, exc.cause, None, None)
        except (KeyboardInterrupt, click.exceptions.Abort):  # click's confirm turns Ctrl-C into Abort
            code = ExitCode.INTERRUPTED
            _report(as_json, code, "interrupted", "interrupted", None, None)
        except BrokenPipeError:
            # The reader of our stdout went away (`gpuops logs | head`): stop quietly, as
            # shell tools do; a followed run stays alive. Point stdout at /dev/null so the
            # interpreter's final flush does not complain.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            code = ExitCode.BROKEN_PIPE
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except Exception as exc:  # the boundary: anything unexpected is a bug, reported with a file
            code = ExitCode.INTERNAL
            message, hint = internal_error(exc)
            _report(as_json, code, "internal-error", message, hint, None)
        sys.exit(code)

    return wrapper


def internal_error(exc: BaseException) -> tuple[str, str]:
    """A bug: its traceback goes to a file; (message, hint) say so, and say why where the file could not be
    written (one message whatever happened to it)."""
    message = f"internal error: {type(exc).__name__}: {exc}"
    try:
        path = crash_report()
    except Exception as err:  # noqa: BLE001 - the bug is said in one line, whatever keeps its file from being written
        return message, f"its traceback could not be written ({err}); please report it with the command that failed"
    return message, f"the traceback is in {path}; please report it"


def error_outcome(code: int, outcome: str, message: str, hint: str | None, exc: Any) -> Outcome:
    """An error as the Outcome its JSON summary shows: the message, the hint, and what was measured."""
    from gpuops.client.events import Outcome

    data: dict[str, Any] = {"error": message}
    if getattr(exc, "run", None):
        data["run"] = exc.run
    if hint:
        data["hint"] = hint
    findings = getattr(exc, "findings", None)
    if findings:
        data["gpus"] = [f.__dict__ for f in findings]
        data["thresholds"] = exc.thresholds
    if getattr(exc, "tail", None):
        data["gpu"] = exc.gpu
        data["output_tail"] = exc.tail
    return Outcome(outcome, code, message, data)


def _report(as_json: bool, code: int, outcome: str, message: str, hint: str | None, exc: Any) -> None:
    if as_json:
        from gpuops.cli.render import JsonRenderer

        JsonRenderer().outcome(error_outcome(code, outcome, message, hint, exc), getattr(exc, "target", None))
        return
    from gpuops.cli.errors_view import show_error

    show_error(message, hint, exc)
