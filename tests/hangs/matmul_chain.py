"""healthy: one long chain of matmuls in a single Python line: nothing in Python moves while it
runs (on a CPU: a BLAS kernel; on a GPU: launches of matmul kernels)."""

import functools
import time

import torch
from _corpus import device, done, seconds, started

started()
dev = device()
n = 512 if dev == "cpu" else 4096
w = torch.randn(n, n, device=dev) / n**0.5
x = torch.randn(n, n, device=dev)
t = time.time()
functools.reduce(torch.matmul, [w] * 20, x)  # (how long one matmul takes here)
if dev == "cuda":
    torch.cuda.synchronize()
factor = 40 if dev == "cpu" else 20  # (on a CPU twice what it takes: a busy machine slows it most)
count = max(20, int(factor * seconds() / max(time.time() - t, 1e-6)))
y = functools.reduce(torch.matmul, [w] * count, x)
float(y.norm())
done()
