"""healthy: a torch training loop that syncs every step (`loss.item()`), its step counter a local
variable: on a GPU it waits in cudaStreamSynchronize most of the time."""

import time

import torch
from _corpus import device, done, started


def train(end: float) -> int:
    dev = device()
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(128, 512, device=dev)
    step = 0
    while time.time() < end:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        last = loss.item()
        step += 1
    return step if last == last else 0


if __name__ == "__main__":
    train(started())
    done()
