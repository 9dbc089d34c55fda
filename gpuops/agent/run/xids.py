"""`python3 -m gpuops_agent xids WINDOW`, run on the host: the Xid lines of the host's kernel log in the last
WINDOW seconds (the host's clock), each classified by NVIDIA's catalog, as marker lines (wire/hostwire.py).

Preflight asks it for the playbook's GPUs' recent Xids, `gpuops health` for each GPU's, and a following client
for a stalled or crashed run's window. It reads the kernel log and writes nothing.
"""

from __future__ import annotations

import json
import sys
import time
from typing import List

from ..system import kernlog
from ..wire.marks import mark
from ..wire.xid import parse_line

#: At most this many Xids (the newest) are said: a burst of Xid 13 lines can fill a ring buffer.
MAX_XIDS = 500


def main(argv: List[str]) -> int:
    window = float(argv[0]) if argv else 3600.0
    now = time.time()
    reader, records, why = kernlog.read_recent(now - window)
    if reader is None:
        print(mark("kernel_log_refused", why))
        return 0
    print(mark("kernel_log", "%s %.3f" % (reader.name, now)))
    found = [x for x in (parse_line(text, t) for t, text in records) if x is not None]
    for event in found[-MAX_XIDS:]:
        print(mark("xid", json.dumps(event.as_json(), sort_keys=True, separators=(",", ":"))))
    sys.stdout.flush()
    return 0


tool_xids = main
