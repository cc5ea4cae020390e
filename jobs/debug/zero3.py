"""zero3: DeepSpeed ZeRO-3 steps across learner actors on different nodes, checked against a
reference computed without ZeRO.

Learners are placed one per bundle with STRICT_SPREAD (as open-instruct places its learners), so
parameters are sharded across nodes. On GPUs: NCCL, one GPU per learner. Without real GPUs:
DS_ACCELERATOR=cpu and gloo. The global batch is fixed (default 240 samples) and split evenly
over the learners; the same model (same seed), optimizer and batch run in one plain PyTorch
process in the driver. ZeRO-3 averages gradients over the learners, so its loss at every step
must equal the reference's: the job fails unless they match within the tolerance
(relative 1e-3, default) and every parameter is sharded (each rank holds about 1/world of it).
A "loss went down" check alone passes or fails by luck at different world sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from rendezvous import free_endpoint

IN, LR = 32, 1e-3


def make_model(hidden: int, layers: int = 1):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    inner = [m for _ in range(layers) for m in (torch.nn.Linear(hidden, hidden), torch.nn.Tanh())]
    return torch.nn.Sequential(
        torch.nn.Linear(IN, hidden), torch.nn.Tanh(), *inner, torch.nn.Linear(hidden, 1)
    )


def batch(global_batch: int):  # type: ignore[no-untyped-def]
    """The whole global batch, the same in every process."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(global_batch, IN, generator=gen)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.1 * x[:, 4:8].sum(dim=1, keepdim=True)
    return x, y


def exact_fp32() -> None:
    """No TF32 on GPUs: the reference runs in plain fp32 on the CPU."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def reference_losses(steps: int, hidden: int, global_batch: int, layers: int = 1) -> list[float]:
    """The same training in one process, without ZeRO and without distributed anything."""
    import torch

    model = make_model(hidden, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = batch(global_batch)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


@ray.remote
class Learner:
    def __init__(self, rank: int, world: int, cuda: bool):
        self.rank, self.world, self.cuda = rank, world, cuda

    def endpoint(self) -> tuple[str, int]:
        return free_endpoint()

    def train(
        self, master: tuple[str, int], steps: int, hidden: int, global_batch: int, layers: int, bf16: bool
    ) -> dict:
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

        exact_fp32()
        deepspeed.init_distributed(dist_backend="nccl" if self.cuda else "gloo")
        model = make_model(hidden, layers)
        total = sum(p.numel() for p in model.parameters())
        micro = global_batch // self.world
        config = {
            "train_batch_size": global_batch,
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
            **({"bf16": {"enabled": True}} if bf16 else {}),
        }
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        local = sum(p.ds_tensor.numel() for p in engine.module.parameters())
        x, y = batch(global_batch)
        dtype = torch.bfloat16 if bf16 else torch.float32
        x = x[self.rank * micro : (self.rank + 1) * micro].to(engine.device, dtype)
        y = y[self.rank * micro : (self.rank + 1) * micro].to(engine.device, dtype)
        losses, times = [], []
        for _ in range(steps):
            start = time.perf_counter()
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            mean = loss.detach().float()
            torch.distributed.all_reduce(mean)  # equal slices: the mean of means is the batch mean
            losses.append(float(mean) / self.world)  # (float() waits for the step to finish)
            times.append(time.perf_counter() - start)
        cuda_mem = self.cuda and torch.cuda.is_available()
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "device": str(engine.device),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "losses": losses,
            "params_total": total,
            "params_local": local,
            "step_s": statistics.median(times[1:] or times),  # the first step warms up
            "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda_mem else None,
            "reserved_gb": torch.cuda.max_memory_reserved() / 1e9 if cuda_mem else None,
        }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=1, help="hidden x hidden layers")
    parser.add_argument("--bf16", action="store_true", help="DeepSpeed bf16 (no fp32 reference to match)")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference (a large model)")
    parser.add_argument("--global-batch", type=int, default=240, help="split evenly over the learners")
    parser.add_argument("--learners", type=int, default=0, help="default: one per node")
    parser.add_argument("--rtol", type=float, default=1e-3, help="loss tolerance against the reference")
    parser.add_argument(
        "--strategy",
        default="STRICT_SPREAD",
        choices=["STRICT_SPREAD", "PACK", "SPREAD"],
        help="placement of the learner bundles (STRICT_SPREAD: one per node)",
    )
    args = parser.parse_args()
    ray.init()
    import torch

    exact_fp32()
    cuda = ray.cluster_resources().get("GPU", 0) > 0 and torch.cuda.is_available()
    nodes = len([n for n in ray.nodes() if n["Alive"]])
    world = args.learners or nodes
    if args.global_batch % world:
        print(f"zero3: a global batch of {args.global_batch} does not split over {world} learners")
        return 2
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
    futures = [
        lr.train.remote(master, args.steps, args.hidden, args.global_batch, args.layers, args.bf16)
        for lr in learners
    ]
    checked = not (args.bf16 or args.no_reference)
    reference = reference_losses(args.steps, args.hidden, args.global_batch, args.layers) if checked else []
    results = ray.get(futures, timeout=900)
    losses = results[0]["losses"]
    errors = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=checked)]
    for step, loss in enumerate(losses, start=1):
        ref = f" (reference without ZeRO {reference[step - 1]:.6f})" if checked else ""
        print(f"step {step}: loss {loss:.6f}{ref}")
    sharded = all(r["params_local"] <= r["params_total"] / world + 1024 for r in results)
    summary = {
        "world": world,
        "hosts": sorted({r["host"] for r in results}),
        "devices": [r["device"] for r in results],
        "cuda_visible_devices": [r["cuda_visible_devices"] for r in results],
        "global_batch": args.global_batch,
        "losses": losses,
        "reference": reference,
        "max_rel_error": max(errors) if errors else None,
        "rtol": args.rtol,
        "matches_reference": max(errors) <= args.rtol if checked else None,
        "loss_finite": all(math.isfinite(v) for v in losses),
        "step_s": round(max(r["step_s"] for r in results), 4),
        "peak_gb": [round(r["peak_gb"], 3) for r in results if r["peak_gb"] is not None],
        "reserved_gb": [round(r["reserved_gb"], 3) for r in results if r["reserved_gb"] is not None],
        "loss_went_down": losses[-1] < losses[0],
        "sharded": sharded,
        "params_total": results[0]["params_total"],
        "params_local": [r["params_local"] for r in results],
    }
    print("ZERO3 " + json.dumps(summary))
    spread = len(summary["hosts"]) == world or args.strategy != "STRICT_SPREAD"
    good = summary["matches_reference"] if checked else summary["loss_finite"]
    return 0 if good and sharded and spread else 1


if __name__ == "__main__":
    sys.exit(main())
