"""`python3 -m gpuops_agent TOOL ARGS...`: the target-side tools gpuops runs through its transport."""

from __future__ import annotations

import importlib
import sys

TOOLS = {
    "follow": "watch.follow",  # stream a run's log and watchdog events as frames
    "prepare": "run.prepare",  # create a run directory from a JSON spec on stdin
    "record": "run.prepare",  # rewrite one JSON record of a run, atomically
    "start": "run.start",  # start the watchdog, then training in tmux
    "pane": "run.pane",  # the training on a terminal in its tmux pane, its output to the log too
    "abort": "run.abort",  # the one abort sequence (claim, signal, grace, kill, reap, drain)
    "supervise": "watch.supervise",  # keep a run's watchdog alive (daemon)
    "watchdog": "watch.watchdog",  # watch one run
    "runs": "run.history",  # the run history of this target, as JSON lines
    "stacks": "run.stacks",  # every thread's stack of the run's Python processes, now or as recorded
    "report": "run.collect",  # one run's records, samples and events for its report, as one JSON object
    "notify": "notify.sender",  # deliver one queued notification of a run (started detached by the watchdog)
    "notify-test": "notify.sender",  # try every notify channel of a playbook once, from here
    "metrics": "metrics.tool",  # the runs of this target that go on or ended lately, for `gpuops metrics`
    "metrics-expire": "metrics.expire",  # an ended run's metrics taken away after keep_ended (started by the watchdog)
    "job-store": "run.jobstore",  # one node's link to its torchrun job's rendezvous store (needs the training's torch)
    "xids": "run.xids",  # on the host: the Xids of its kernel log's last seconds, classified
    "host-watch": "watch.hostwatch",  # on the host: follow its kernel log for a run's GPUs while the run lives
    "host-link": "watch.hostlink",  # beside the run: what the host's follower hands over, into the run directory
}


def main(argv: list) -> int:
    if not argv or argv[0] not in TOOLS:
        sys.stderr.write("usage: python3 -m gpuops_agent {%s} ...\n" % ",".join(sorted(TOOLS)))
        return 2
    module = importlib.import_module("." + TOOLS[argv[0]], __package__)
    tool = getattr(module, "tool_" + argv[0].replace("-", "_"), None) or module.main
    return int(tool(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
