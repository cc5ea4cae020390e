"""burn: keep a known number of cores (or GPUs) busy, to check `raystack top` and the report.

`python burn.py --seconds 30 --cores 1 [--node worker|head|<ip>]` runs `cores` Ray tasks that
spin on the chosen node (default: a worker node, else the head); `--gpus N` runs N tasks of one
GPU each (anywhere) doing back-to-back matrix products on it. Prints when the burn started and
ended (epoch seconds), so a test can compare what it sees with what it did.
"""

from __future__ import annotations

import argparse
import json
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=1)
def spin(seconds: float) -> int:
    end, n = time.time() + seconds, 0
    while time.time() < end:
        n += 1
    return n


@ray.remote(num_gpus=1, num_cpus=0)
def matmuls(seconds: float) -> int:
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    end, n = time.time() + seconds, 0
    while time.time() < end:
        for _ in range(20):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()
        n += 20
    return n


def pick(where: str) -> dict:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    head = [n for n in nodes if "node:__internal_head__" in n["Resources"]]
    workers = [n for n in nodes if n not in head]
    if where == "head":
        return head[0]
    if where == "worker":
        return (workers or head)[0]
    return next(n for n in nodes if n["NodeManagerAddress"] == where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=0, help="GPU tasks instead of CPU ones")
    parser.add_argument("--node", default="worker", help="worker, head or a node address")
    args = parser.parse_args()
    ray.init()
    if args.gpus:
        tasks, node = [matmuls.remote(args.seconds) for _ in range(args.gpus)], "any"
    else:
        chosen = pick(args.node)
        where = NodeAffinitySchedulingStrategy(chosen["NodeID"], soft=False)
        node = chosen["NodeManagerAddress"]
        tasks = [spin.options(scheduling_strategy=where).remote(args.seconds) for _ in range(args.cores)]
    print(json.dumps({"burn": "start", "t": time.time(), "node": node}), flush=True)
    ray.get(tasks)
    print(json.dumps({"burn": "end", "t": time.time(), "cores": args.cores, "gpus": args.gpus}), flush=True)


if __name__ == "__main__":
    main()
