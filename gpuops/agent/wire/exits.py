"""The exit codes of the contract (README, "Exit codes"), defined once: the CLI exits with them
(gpuops.errors maps each error to one) and the agent records them (a run's outcome, a node's end).
Standard library only."""


class ExitCode:
    """Each exit code gpuops has, by what it means."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    CONNECT = 3
    PREFLIGHT = 4
    WARMUP = 5
    TRAINING_FAILED = 6
    ABORTED = 7
    STALLED = 8
    NOTIFY_FAILED = 9  # notify-test: a channel did not take the test notification
    HARDWARE = 10  # a GPU of the run failed (an Xid that needs a reset or more, uncorrected ECC, lost): its hardware
    TIMEOUT = 124
    INTERRUPTED = 130
    BROKEN_PIPE = 141  # stdout closed by its reader, as a shell reports SIGPIPE
    TERMINATED = 143  # SIGTERM (a cancelled CI job): handled as Ctrl-C is, 128 + 15
    HANGUP = 129  # SIGHUP (its terminal or SSH session closed): handled as SIGTERM is, 128 + 1
