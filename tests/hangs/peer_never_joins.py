"""hung: a rank whose peer never joins a collective: every rank joins a first all-reduce, then the
last rank sleeps instead of joining the second (gloo on CPUs: the others sleep in its wait; NCCL
on GPUs: they spin at 100 % GPU inside cudaStreamSynchronize). Run by a launcher, 2 ranks or more."""

import os
import threading

import torch
import torch.distributed as dist
from _corpus import device, rank, started

if __name__ == "__main__":
    started()
    gpu = device() == "cuda"
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK") or 0))
    dist.init_process_group("nccl" if gpu else "gloo")
    x = torch.ones(1 << 20, device="cuda" if gpu else "cpu")
    dist.all_reduce(x)
    if rank() == dist.get_world_size() - 1:
        threading.Event().wait()  # (stuck elsewhere: in data loading, behind an `if rank == 0:`)
    dist.all_reduce(x)
    if gpu:
        torch.cuda.synchronize()
