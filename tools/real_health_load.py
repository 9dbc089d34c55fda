"""A bf16 matmul loop on cuda:0 for ARGV[1] seconds: the load tools/real_health.py samples under."""

import sys
import time

import torch

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    n += 1
print("load done", n, flush=True)
