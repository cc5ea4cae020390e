"""ds_zero3: DeepSpeed ZeRO-3 steps under the DeepSpeed launcher, checked against a reference.

Launched with `deepspeed` (`kind: spmd, launcher: deepspeed`): a fixed global batch is split over
the ranks, ZeRO-3 shards the model, and rank 0 also trains the same model on the whole batch in
plain PyTorch: every step's loss must match within --rtol. DS_ACCELERATOR=cpu and gloo without
GPUs.
"""

from __future__ import annotations

import argparse
import os

import deepspeed
import torch
import torch.distributed as dist
from ranks import leave, report

IN, HIDDEN, LR = 32, 64, 1e-3


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1))


def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, IN, generator=gen)
    return x, torch.sin(x[:, :4].sum(1, keepdim=True))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=48)
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--local_rank", type=int, default=0)  # the DeepSpeed launcher passes it
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    micro = args.global_batch // world
    config = {
        "train_batch_size": args.global_batch,
        "train_micro_batch_size_per_gpu": micro,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    net = model()
    engine, *_ = deepspeed.initialize(
        model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=LR), config=config
    )
    x, y = data(args.global_batch)
    xs, ys = (
        x[rank * micro : (rank + 1) * micro].to(engine.device),
        y[rank * micro : (rank + 1) * micro].to(engine.device),
    )
    losses = []
    for _ in range(args.steps):
        loss = torch.nn.functional.mse_loss(engine(xs), ys)
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
    ok = True
    if rank == 0:
        ref, opt = model(), None
        opt = torch.optim.AdamW(ref.parameters(), lr=LR)
        expected = []
        for _ in range(args.steps):
            loss = torch.nn.functional.mse_loss(ref(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            expected.append(float(loss))
        err = max(abs(a - b) / abs(b) for a, b in zip(losses, expected, strict=True))
        ok = err <= args.rtol
        report(
            "DS_ZERO3",
            {
                "world": world,
                "losses": losses,
                "reference": expected,
                "max_rel_error": err,
                "matches_reference": ok,
            },
        )
    # Every rank leaves the process group together (a rank that left while rank 0 still computed
    # its reference died of SIGABRT), then exits without the interpreter's teardown (ranks.leave).
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    leave(main())
