"""rankfault: the ways a distributed training job really dies or hangs, one rank at a time.

Run by a launcher on every node (`kind: spmd`, e.g. torchrun; jobs/debug/rankfault.yaml). Every
rank joins one all-reduce (NCCL with GPUs, gloo without) and prints `RANKFAULT first rank=R`;
then rank --rank (default: the last) does what --mode says while the others go on:

  hang        it never joins the second all-reduce (sleeps); the others wait in it: with NCCL they
              spin at 100 % GPU in torch.cuda.synchronize(), with gloo they sleep in wait()
  spin        as hang, but the others poll the async all-reduce in a Python loop (a busy CPU core)
  busy        no fault: every rank computes for --seconds in a Python/numpy loop whose stack
              changes, printing nothing, then all of them finish (a quiet evaluation: not hung)
  oom         it asks its GPU for 1 TiB (torch.OutOfMemoryError)
  segv        it reads address 0 (SIGSEGV)
  kill        it SIGKILLs itself while the others wait in the second all-reduce
  cuda-error  a device-side assert (an index out of bounds on the GPU)
  nccl-error  it joins the process group on GPU 0, which rank 0 uses too (ncclInvalidUsage:
              Duplicate GPU detected), the usual mistake of a wrong LOCAL_RANK
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import signal
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

MODES = ("hang", "spin", "busy", "oom", "segv", "kill", "cuda-error", "nccl-error")


def say(text: str) -> None:
    print(f"RANKFAULT {text}", flush=True)


def evaluate(seconds: float) -> float:
    """A quiet evaluation: numpy work whose Python stack changes from one line to the next."""
    rng = np.random.default_rng(0)
    total, end = 0.0, time.time() + seconds
    while time.time() < end:
        a = rng.standard_normal((64, 64))
        b = a @ a.T
        total += float(np.trace(b))
        total = score(total, b)
    return total


def score(total: float, b: np.ndarray) -> float:
    for row in b[:8]:
        total -= float(row.max()) * 1e-9
    return total


def before_init(mode: str, cuda: bool) -> None:
    """The faults of the chosen rank that come before it joins the process group."""
    if mode in ("segv", "oom", "cuda-error"):
        say(f"fault {mode} t={time.time():.3f}")  # (when it happens: tests time the job's end from it)
    if mode == "segv":
        ctypes.string_at(0)
    if mode == "oom" and cuda:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")  # 1 TiB
    if mode == "cuda-error" and cuda:
        x = torch.ones(4, device="cuda")
        print(x[torch.tensor([7], device="cuda")].sum().item())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--rank", type=int, default=-1, help="the rank that misbehaves (default: the last)")
    p.add_argument("--seconds", type=float, default=30.0, help="busy: how long every rank computes")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    me = rank == (args.rank % world)
    device = (
        torch.device("cuda", 0 if me and args.mode == "nccl-error" else local)
        if cuda
        else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    if me:
        before_init(args.mode, cuda)
    if me and args.mode == "nccl-error":
        say(f"fault nccl-error t={time.time():.3f}")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    x = torch.ones(1 << 16, device=device)
    dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    say(f"first rank={rank} world={world} host={socket.gethostname()} pid={os.getpid()} device={device}")
    if args.mode == "busy":
        evaluate(args.seconds)
    elif me and args.mode in ("hang", "spin"):
        time.sleep(10**6)  # never joins the second all-reduce
    elif me and args.mode == "kill":
        time.sleep(2)  # (the others are in the all-reduce by now)
        say(f"fault kill t={time.time():.3f}")
        os.kill(os.getpid(), signal.SIGKILL)
    if args.mode == "spin" and not me:
        work = dist.all_reduce(x, async_op=True)
        # NOTE: polled inside one call (iter() calls is_completed until it is True), as NCCL's wait
        # spins inside cudaStreamSynchronize: a CPU core busy, the stack the same. (A Python loop
        # over two lines would move from line to line: docs/troubleshooting.md.)
        any(iter(work.is_completed, True))
    else:
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    say(f"done rank={rank}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
