"""A trainer that uses SIGUSR1 itself (its own handler, as some checkpointing schemes do), then hangs."""
import os
import signal
import time

handled = []
signal.signal(signal.SIGUSR1, lambda signum, frame: handled.append(signum))


def hang_after_checkpoints():
    for n in range(3):
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while len(handled) <= n and time.monotonic() < deadline:
            time.sleep(0.01)
        print("usr1 handled %d" % len(handled), flush=True)
    while True:
        time.sleep(0.1)


hang_after_checkpoints()
