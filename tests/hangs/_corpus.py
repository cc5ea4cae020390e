"""What every program of the hang corpus shares: its device, how long a healthy one works, and the
lines it prints (one at its start, one at its end: nothing in between)."""

from __future__ import annotations

import os
import sys
import time


def seconds() -> float:
    """How long a healthy program works without printing (CORPUS_SECONDS; 3 x hang_timeout or more)."""
    return float(os.environ.get("CORPUS_SECONDS") or 60)


def device() -> str:
    """'cuda' where a GPU is visible (CORPUS_DEVICE=cpu keeps it off), else 'cpu'."""
    if os.environ.get("CORPUS_DEVICE", "auto") == "cpu":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def rank() -> int:
    return int(os.environ.get("RANK") or 0)


def say(text: str) -> None:
    print(f"CORPUS {text} {os.path.basename(sys.argv[0])} rank={rank()} t={time.time():.3f}", flush=True)


def started() -> float:
    """Print the start line; the time the program must stop working at."""
    say("start")
    return time.time() + seconds()


def done() -> None:
    say("done")


def over(end: float) -> bool:
    """Whether the work is over: every rank of a process group agrees (one that stopped alone would
    leave the others waiting in their next collective)."""
    import torch
    import torch.distributed as dist

    stop = time.time() >= end
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([float(stop)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop = bool(flag.item())
    return stop
