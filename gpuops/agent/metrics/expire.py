"""`python3 -m gpuops_agent metrics-expire RUN_ID`: an ended run's series taken away `watch.metrics.keep_ended`
seconds after its end: its textfile removed, its Pushgateway group deleted.

Started detached by the watchdog once the run ended and its final state was written (publish.py). Prometheus
then stops reading the run: its series end (a dashboard shows them until then, with the run's end and exit
code). A run directory deleted meanwhile ends the wait at once. What cannot be done (the Pushgateway down) is
given up: the group stays until someone deletes it (docs/metrics.md says how).
"""

from __future__ import annotations

import os
import time
from typing import List

from ..wire import protocol as p
from ..wire import watchfile
from ..wire.masking import Masker
from .outlets import PushFailed, group_url, push, remove_textfile, textfile_name

#: How often the wait looks whether the run directory is still there.
LOOK_EVERY = 5.0


def expire(d: str, run_id: str, cfg: watchfile.WatchConfig) -> None:
    m, job = cfg.metrics, cfg.job
    if m.textfile:
        try:
            remove_textfile(os.path.expanduser(m.textfile), textfile_name(run_id, job.node_rank if job else None))
        except OSError:
            pass
    if m.pushgateway:
        try:
            push(group_url(m.pushgateway, run_id, job.node_name if job else ""), None, Masker(list(cfg.secrets)))
        except PushFailed:
            pass


def main(argv: List[str]) -> int:
    (run_id,) = argv
    d = p.run_dir(run_id)
    cfg = watchfile.read(d)
    if cfg is None or not cfg.metrics.on:
        return 0
    until = time.time() + max(0.0, cfg.metrics.keep_ended)
    while time.time() < until and os.path.isdir(d):
        time.sleep(min(LOOK_EVERY, max(0.0, until - time.time())))
    expire(d, run_id, cfg)
    return 0


tool_metrics_expire = main
