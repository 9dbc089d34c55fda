"""A training loop of STEPS steps that waits at step HOLD until the file RELEASE exists (a test takes its stacks then)."""
import os
import sys
import time

STEPS, HOLD, RELEASE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


def training_loop():
    for step in range(1, STEPS + 1):
        print("step %d/%d" % (step, STEPS), flush=True)
        while step == HOLD and not os.path.exists(RELEASE):
            time.sleep(0.05)
        time.sleep(0.01)


training_loop()
print("training done", flush=True)
