"""allreduce: torch.distributed all-reduce across the cluster, checked, with bus bandwidth.

One Ray actor per GPU (NCCL) when the cluster has real GPUs, else one per node (gloo on CPU),
placed with a placement group (PACK for GPUs, STRICT_SPREAD for nodes). Every rank contributes
rank+1; the result must be world*(world+1)/2 everywhere. Bus bandwidth as nccl-tests defines it:
2*(n-1)/n * bytes / time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import ray
from ranks import bus_bandwidth, timed_allreduce
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from rendezvous import free_endpoint


@ray.remote
class Rank:
    def __init__(self, rank: int, world: int, device: str):
        self.rank, self.world, self.device = rank, world, device

    def endpoint(self) -> tuple[str, int]:
        return free_endpoint()

    def run(self, master: tuple[str, int], size_mb: float, iters: int) -> dict:
        import torch
        import torch.distributed as dist

        backend = "nccl" if self.device == "cuda" else "gloo"
        dist.init_process_group(
            backend, init_method=f"tcp://{master[0]}:{master[1]}", rank=self.rank, world_size=self.world
        )
        device = torch.device("cuda:0" if self.device == "cuda" else "cpu")
        ok, seconds = timed_allreduce(size_mb, iters, self.rank, self.world, device)
        dist.destroy_process_group()
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "ok": ok,
            "seconds": seconds,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "backend": backend,
        }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=float, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    args = parser.parse_args()
    ray.init()
    import torch

    gpus = int(ray.cluster_resources().get("GPU", 0))
    use_cuda = args.device == "cuda" or (args.device == "auto" and gpus > 0 and torch.cuda.is_available())
    nodes = len([n for n in ray.nodes() if n["Alive"]])
    if use_cuda:
        world, bundle, strategy, opts = gpus, {"GPU": 1, "CPU": 1}, "PACK", {"num_gpus": 1, "num_cpus": 1}
    else:
        world, bundle, strategy, opts = nodes, {"CPU": 1}, "STRICT_SPREAD", {"num_cpus": 1}
    pg = placement_group([bundle] * world, strategy=strategy)
    ray.get(pg.ready(), timeout=300)
    ranks = [
        Rank.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i), **opts
        ).remote(i, world, "cuda" if use_cuda else "cpu")
        for i in range(world)
    ]
    master = ray.get(ranks[0].endpoint.remote())
    results = ray.get([r.run.remote(master, args.size_mb, args.iters) for r in ranks], timeout=600)
    seconds = max(r["seconds"] for r in results)
    busbw = bus_bandwidth(world, args.size_mb, seconds)
    summary = {
        "world": world,
        "backend": results[0]["backend"],
        "size_mb": args.size_mb,
        "hosts": sorted({r["host"] for r in results}),
        "all_ok": all(r["ok"] for r in results),
        "seconds_per_allreduce": round(seconds, 6),
        "busbw_gb_s": round(busbw, 3),
    }
    print(
        f"all-reduce of {args.size_mb:g} MiB over {world} ranks ({summary['backend']}) on "
        f"{len(summary['hosts'])} hosts: {seconds * 1e3:.2f} ms, bus bandwidth {busbw:.2f} GB/s, "
        f"sum {'correct' if summary['all_ok'] else 'WRONG'}"
    )
    print("ALLREDUCE " + json.dumps(summary))
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
