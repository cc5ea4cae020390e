"""What the debug jobs' ranks share (torch.distributed, no Ray): whole result lines, and the
all-reduce that allreduce.py (Ray actors) and spmd.py (torchrun) time the same way."""

from __future__ import annotations

import json
import os
import sys
import time


def report(tag: str, data: dict) -> None:
    """One whole line in one write: the ranks of a node share a pipe, and a print() split into
    text and newline interleaves with the other ranks' lines."""
    os.write(1, f"{tag} {json.dumps(data)}\n".encode())


def leave(code: int) -> None:
    """Exit with `code` once the process group is destroyed, without the interpreter's teardown.

    DeepSpeed's CPU accelerator and gloo keep C++ threads that can still hold tensors when Python
    finalizes; a rank of a job whose work is done, its group left, then dies of SIGABRT (exit -6,
    "terminate called without an active exception": pytorch/pytorch#179291). Seen in CI on rank 2,
    rank 3 and rank 0 of 4 even after a barrier and destroy_process_group(); rare (26 runs in a
    row passed by hand), so every DeepSpeed debug rank exits this way."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def timed_allreduce(size_mb: float, iters: int, rank: int, world: int, device) -> tuple[bool, float]:  # type: ignore[no-untyped-def]
    """All-reduce `size_mb` of float32 holding rank+1: a warm-up that checks the sum, then `iters`
    timed ones. (whether the sum was right, seconds per all-reduce on this rank)"""
    import torch
    import torch.distributed as dist

    tensor = torch.full((int(size_mb * 2**20 / 4),), rank + 1.0, dtype=torch.float32, device=device)
    dist.all_reduce(tensor)
    ok = bool(torch.all(tensor == world * (world + 1) / 2).item())
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return ok, (time.perf_counter() - start) / iters


def bus_bandwidth(world: int, size_mb: float, seconds: float) -> float:
    """GB/s as nccl-tests defines it for all-reduce: 2*(n-1)/n * bytes / time."""
    return 2 * (world - 1) / world * size_mb * 2**20 / seconds / 1e9 if world > 1 else 0.0
