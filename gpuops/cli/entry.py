"""The `gpuops` console entry point: run the command, then leave without interpreter teardown.

A normal exit tears down every module, object and thread state the command loaded (paramiko,
cryptography, click, yaml ...): 15-20 ms here on every `gpuops status`, for nothing, as the
process is ending. Here the output is flushed, threads the interpreter would wait for are
joined, and the process ends with os._exit. Tests that call `main` in-process keep the normal path.
"""

from __future__ import annotations

import os
import sys
import threading


def run() -> None:
    from gpuops.cli.main import main

    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:  # Ctrl-C before the command's own boundary was reached (click parsing)
        from gpuops.errors import ExitCode

        sys.stderr.write("gpuops: interrupted\n")
        code = ExitCode.INTERRUPTED
    exit_now(code)


def exit_now(code: object) -> None:
    """sys.exit's meaning of `code`, without the teardown."""
    from gpuops.errors import ExitCode

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): the message on stderr, status 1
        sys.stderr.write(f"{code}\n")
        status = 1
    main_thread = threading.main_thread()
    for thread in threading.enumerate():  # what interpreter shutdown would wait for
        if thread is not main_thread and not thread.daemon:
            thread.join()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # the reader went away (`gpuops logs | head`): as a shell reports SIGPIPE
            status = ExitCode.BROKEN_PIPE if stream is sys.stdout else status
        except (OSError, ValueError):  # closed or broken stream: nothing more can be said
            pass
    os._exit(status & 0xFF)  # as the kernel reports sys.exit(-1): 255
