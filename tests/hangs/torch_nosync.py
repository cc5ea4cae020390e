"""healthy: a training loop that never syncs (no `.item()`, no print): on a GPU its launches run
ahead until CUDA's queue is full, and the loop then waits inside a launch."""

import time

import torch
from _corpus import device, done, started

end = started()
dev = device()
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(256, 1024, device=dev)
while time.time() < end:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
if dev == "cuda":
    torch.cuda.synchronize()
done()
