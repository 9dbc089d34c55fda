"""Two gloo ranks under torchrun; rank 1 is elsewhere (asleep) for its 6th all_reduce while rank 0 waits in it.
A helper thread of each rank dumps its Flight Recorder 8 s in (while the main thread waits in the collective)
and sends the process SIGUSR1, to see whether a Python signal handler runs meanwhile. ARGV[1]: where the dumps go.
Run by tools/real_health.py."""

import datetime
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
rank = int(os.environ["RANK"])
seen = {"signal": False}
def on_signal(*_):
    seen["signal"] = True
signal.signal(signal.SIGUSR1, on_signal)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=40))
c10d = torch._C._distributed_c10d
have = {n: hasattr(c10d, n) for n in ("_dump_fr_trace", "_dump_fr_trace_json", "_dump_nccl_trace", "_dump_nccl_trace_json")}
def dump_later():
    time.sleep(8)
    t0 = time.time()
    try:
        text = c10d._dump_fr_trace_json()
        took = time.time() - t0
        open(os.path.join(out, "rank%d.json" % rank), "wb").write(text if isinstance(text, bytes) else text.encode())
        status = "json ok in %.3fs (%s)" % (took, type(text).__name__)
    except Exception as exc:
        status = "json failed: %r" % (exc,)
    try:
        blob = c10d._dump_fr_trace()
        open(os.path.join(out, "rank%d.pickle" % rank), "wb").write(blob)
        status += "; pickle %d bytes" % len(blob)
    except Exception as exc:
        status += "; pickle failed: %r" % (exc,)
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(1)
    json.dump({"rank": rank, "torch": torch.__version__, "have": have, "status": status,
               "python_signal_handler_ran_while_main_waits": seen["signal"]},
              open(os.path.join(out, "rank%d-status.json" % rank), "w"))
threading.Thread(target=dump_later, daemon=True).start()
x = torch.ones(4)
for step in range(1, 12):
    if rank == 1 and step == 6:
        print("rank 1 skips all_reduce", step, flush=True)
        time.sleep(30)
        continue
    dist.all_reduce(x)
    print("rank", rank, "step", step, flush=True)
    time.sleep(0.2)
print("rank", rank, "left the loop", flush=True)
