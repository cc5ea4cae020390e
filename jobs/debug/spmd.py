"""spmd: what every rank of an SPMD launch sees, an all-reduce, and a few DDP steps.

Run by a launcher on every node (`kind: spmd`, e.g. torchrun): each rank prints one `SPMD_RANK`
line (world size, rank, local rank, host, the GPUs it sees) and checks an all-reduce; then a few
steps of a small model under DistributedDataParallel. NCCL with GPUs, gloo without.
`--fail-rank R --fail-code C` makes rank R exit with code C (to test failure handling);
`--sleep S` keeps every rank busy for S seconds (to test stopping); `--chatter N` has every rank
print() N lines at once (the job's log must hold them whole, each with its rank).
"""

from __future__ import annotations

import time

BEGUN = time.time()  # (before torch's import: bench/spmd_launch.py's breakdown)

import argparse  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ranks import bus_bandwidth, report, timed_allreduce  # noqa: E402

IMPORTED = time.time()


def bandwidth(size_mb: float, iters: int, rank: int, world: int, device: torch.device) -> None:
    """Bus bandwidth of an all-reduce of `size_mb`, timed as allreduce.py times it (ranks.py), so
    that the two can be compared; the slowest rank's time counts."""
    ok, per_iter = timed_allreduce(size_mb, iters, rank, world, device)
    seconds = torch.tensor([per_iter], device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    busbw = bus_bandwidth(world, size_mb, seconds.item())
    if rank == 0:
        report(
            "SPMD_ALLREDUCE", {"world": world, "size_mb": size_mb, "ok": ok, "busbw_gb_s": round(busbw, 3)}
        )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-code", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--allreduce-mb", type=float, default=0.0, help="measure the bus bandwidth of this size")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--chatter", type=int, default=0, help="print() this many lines per rank (whole lines?)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    ok = value.item() == world * (world + 1) / 2
    info = {
        "rank": rank,
        "world": world,
        "local_rank": local,
        "host": socket.gethostname(),
        "node_rank": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "-1"))),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "allreduce_ok": ok,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "nice": os.nice(0),  # raystack runs the ranks at niceness 0 (Ray's workers: 15)
        "t": time.time(),  # when this rank was up (bench/spmd_launch.py)
        "t_begun": BEGUN,  # its python running its first line
        "t_imported": IMPORTED,  # torch imported (the rest: the rendezvous and an all-reduce)
    }
    report("SPMD_RANK", info)
    for i in range(args.chatter):  # plain print(): text and newline may be two writes (unbuffered)
        print(f"SPMD_CHATTER rank={rank} i={i} " + "x" * 64)
    if rank == args.fail_rank:
        print(f"rank {rank} exits {args.fail_code} on purpose", flush=True)
        sys.stderr.flush()
        # os._exit, not sys.exit: tearing down a gloo group at interpreter exit while the other
        # ranks are mid-collective can abort (SIGABRT, exit -6), hiding the code asked for
        os._exit(args.fail_code)
    if args.allreduce_mb:
        bandwidth(args.allreduce_mb, args.iters, rank, world, device)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(16, 1).to(device), device_ids=[local] if cuda else None
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(args.steps):
        x = torch.randn(8, 16, generator=gen).to(device)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 5))
    weights = model.module.weight.detach().clone()
    gathered = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    in_sync = all(torch.equal(g, gathered[0]) for g in gathered)  # DDP keeps every replica equal
    time.sleep(args.sleep)
    dist.barrier()
    if rank == 0:
        report("SPMD_DEBUG", {"world": world, "allreduce_ok": ok, "ddp_in_sync": in_sync, "losses": losses})
    dist.destroy_process_group()
    return 0 if ok and in_sync else 1


if __name__ == "__main__":
    sys.exit(main())
