"""healthy: the same loop written at a script's top level, as many first scripts are (py-spy shows
no variables there, only lines), syncing every step."""

import time

import torch
from _corpus import device, done, started

end = started()
dev = device()
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(128, 512, device=dev)
while time.time() < end:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    last = loss.item()
done()
