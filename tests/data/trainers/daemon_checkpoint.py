"""A trainer that daemonizes the old way (every descriptor closed, stdio back on /dev/null), opens its
checkpoint (argv[1]) and writes it, keeps it open, says so in the run's log, and then hangs."""
import os
import sys
import time

checkpoint, content = sys.argv[1], sys.argv[2].encode()
print("step 1: daemonizing", flush=True)
os.closerange(0, os.sysconf("SC_OPEN_MAX"))
null = os.open(os.devnull, os.O_RDWR)  # fd 0
os.dup2(null, 1)
os.dup2(null, 2)
ckpt = os.open(checkpoint, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # the lowest free descriptor: 3
os.write(ckpt, content)
log = os.open(os.path.join(os.environ["GPUOPS_RUN_DIR"], "log"), os.O_WRONLY | os.O_APPEND)
os.write(log, b"checkpoint saved on fd %d\n" % ckpt)
os.close(log)


def hang_with_the_checkpoint_open():
    while True:
        time.sleep(0.1)


hang_with_the_checkpoint_open()
