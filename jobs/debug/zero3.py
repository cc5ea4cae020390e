"""zero3: a few DeepSpeed ZeRO-3 steps of a small model across learner actors on different nodes.

Learners are placed one per bundle with STRICT_SPREAD (as open-instruct places its learners), so
parameters are sharded across nodes. On GPUs: NCCL, one GPU per learner. Without real GPUs:
DS_ACCELERATOR=cpu and gloo. Prints the loss of every step; fails unless it went down and every
parameter is sharded (each rank holds about 1/world of it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from rendezvous import free_endpoint


@ray.remote
class Learner:
    def __init__(self, rank: int, world: int, cuda: bool):
        self.rank, self.world, self.cuda = rank, world, cuda

    def endpoint(self) -> tuple[str, int]:
        return free_endpoint()

    def train(self, master: tuple[str, int], steps: int, hidden: int) -> dict:
        os.environ.update(
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
        )
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if self.cuda else "cpu")
        import deepspeed
        import torch

        deepspeed.init_distributed(dist_backend="nccl" if self.cuda else "gloo")
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )
        total = sum(p.numel() for p in model.parameters())
        config = {
            "train_micro_batch_size_per_gpu": 16,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        }
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        local = sum(p.ds_tensor.numel() for p in engine.module.parameters())
        gen = torch.Generator().manual_seed(1234 + self.rank)
        x = torch.randn(16, 32, generator=gen).to(engine.device)
        y = (x.sum(dim=1, keepdim=True) * 0.1).to(engine.device)
        losses = []
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            mean = loss.detach().clone()
            torch.distributed.all_reduce(mean)
            losses.append(float(mean) / self.world)
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "losses": losses,
            "params_total": total,
            "params_local": local,
        }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--learners", type=int, default=0, help="default: one per node")
    parser.add_argument(
        "--strategy",
        default="STRICT_SPREAD",
        choices=["STRICT_SPREAD", "PACK", "SPREAD"],
        help="placement of the learner bundles (STRICT_SPREAD: one per node)",
    )
    args = parser.parse_args()
    ray.init()
    import torch

    cuda = ray.cluster_resources().get("GPU", 0) > 0 and torch.cuda.is_available()
    nodes = len([n for n in ray.nodes() if n["Alive"]])
    world = args.learners or nodes
    bundle = {"GPU": 1, "CPU": 1} if cuda else {"CPU": 1}
    if args.strategy == "STRICT_SPREAD" and world > nodes:
        print(f"zero3: {world} learners cannot be STRICT_SPREAD over {nodes} nodes (it would wait forever)")
        return 2
    pg = placement_group([bundle] * world, strategy=args.strategy)
    ray.get(pg.ready(), timeout=300)
    learners = [
        Learner.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
            num_cpus=1,
            num_gpus=1 if cuda else 0,
        ).remote(i, world, cuda)
        for i in range(world)
    ]
    master = ray.get(learners[0].endpoint.remote())
    results = ray.get([lr.train.remote(master, args.steps, args.hidden) for lr in learners], timeout=900)
    losses = results[0]["losses"]
    for step, loss in enumerate(losses, start=1):
        print(f"step {step}: loss {loss:.6f}")
    sharded = all(r["params_local"] <= r["params_total"] / world + 1024 for r in results)
    summary = {
        "world": world,
        "hosts": sorted({r["host"] for r in results}),
        "losses": losses,
        "loss_went_down": losses[-1] < losses[0],
        "sharded": sharded,
        "params_total": results[0]["params_total"],
        "params_local": [r["params_local"] for r in results],
    }
    print("ZERO3 " + json.dumps(summary))
    spread = len(summary["hosts"]) == world or args.strategy != "STRICT_SPREAD"
    return 0 if summary["loss_went_down"] and sharded and spread else 1


if __name__ == "__main__":
    sys.exit(main())
