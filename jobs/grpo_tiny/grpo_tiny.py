"""grpo_tiny: a tiny but real GRPO run, end to end, without a model hub.

What the Isambard-AI GRPO run book checks by hand, in one job: Ray init, rollouts from vLLM
engines (Ray actors, PACK bundles), group-normalised advantages and a clipped policy loss,
learners training with DeepSpeed ZeRO-3 across nodes (STRICT_SPREAD bundles), new weights pushed
into the engines after every step over a process group (gloo on CPU, NCCL on GPUs), checkpoints
every K steps to an absolute shared path, and resume from them.

The layout comes in open-instruct's own flags, so a spec fills them from the planner:
    python grpo_tiny.py {plan.flags} --steps 25      # --num_learners_per_node 1 1 --vllm_num_engines 2 ...

Prints one `GRPO_STEP {json}` line per step and a `GRPO {json}` summary: rewards, the rollout
backend it used (vllm, or torch where vLLM is not installed), engine start time, and the step
time split (generation / training / weight sync). `--single_gpu_mode` (what the planner gives a
one-GPU cluster) puts one learner and one engine on one GPU, as open-instruct does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import ray
import tiny
from engines import Engine, vllm_available
from learners import Learner, free_endpoint
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

stopping = False


def on_term(_signum: int, _frame: object) -> None:
    global stopping
    stopping = True


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # open-instruct's layout flags (what `raystack plan grpo` prints)
    p.add_argument("--num_learners_per_node", type=int, nargs="+", default=[1])
    p.add_argument("--vllm_num_engines", type=int, default=1)
    p.add_argument("--vllm_tensor_parallel_size", type=int, default=1)
    p.add_argument("--single_gpu_mode", action="store_true")
    # the run
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    p.add_argument("--epochs", type=int, default=2, help="clipped updates per batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--learner-cpus-per-gpu", type=int, default=1, help="CPUs in each learner bundle per GPU")
    p.add_argument("--rollouts", choices=["auto", "vllm", "torch"], default="auto")
    p.add_argument(
        "--kill-engine-at-step",
        type=int,
        default=-1,
        help="fault test: engine 0 is killed (SIGKILL) mid-generation",
    )
    p.add_argument(
        "--dir", default=os.environ.get("RAYSTACK_OUTPUT_CHECKPOINTS", ""), help="absolute, shared"
    )
    return p.parse_args()


def bundles(sizes: list[int], cpus_per_gpu: int, gpus: bool) -> list[dict]:
    return [({"GPU": n} if gpus else {}) | {"CPU": max(1, cpus_per_gpu * n)} for n in sizes]


SHARED_GPU = 0.48  # each of the learner and the engine on one GPU (open-instruct's share)
SHARED_VLLM_MEMORY = 0.3  # vLLM's share of that GPU's memory: the learner needs the rest


def place_single_gpu(args: argparse.Namespace, cuda: bool, backend: str, model_dir: str) -> tuple[list, list]:
    """--single_gpu_mode: one learner and one engine on one GPU, in one bundle, as open-instruct
    colocates them (fractional GPUs; vLLM's memory share capped)."""
    if args.num_learners_per_node != [1] or args.vllm_num_engines != 1 or args.vllm_tensor_parallel_size != 1:
        raise SystemExit("grpo_tiny: --single_gpu_mode takes one learner and one engine of TP 1")
    pg = placement_group([{"GPU": 1, "CPU": max(2, args.learner_cpus_per_gpu)}], "PACK")
    ray.get(pg.ready(), timeout=600)
    here = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
    learner = Learner.options(scheduling_strategy=here, num_gpus=SHARED_GPU, num_cpus=1).remote(0, 1, cuda)
    engine = Engine.options(scheduling_strategy=here, num_gpus=SHARED_GPU, num_cpus=1).remote(
        model_dir, backend, cuda, args.seed, SHARED_VLLM_MEMORY
    )
    return [learner], [engine]


def place_actors(
    args: argparse.Namespace, gpus: bool, cuda: bool, backend: str, model_dir: str
) -> tuple[list, list]:
    if args.single_gpu_mode and gpus:
        return place_single_gpu(args, cuda, backend, model_dir)
    learner_pg = placement_group(
        bundles(args.num_learners_per_node, args.learner_cpus_per_gpu, gpus), "STRICT_SPREAD"
    )
    tp = args.vllm_tensor_parallel_size
    engine_pg = placement_group([({"GPU": tp} if gpus else {}) | {"CPU": tp}] * args.vllm_num_engines, "PACK")
    ray.get([learner_pg.ready(), engine_pg.ready()], timeout=600)
    world = sum(args.num_learners_per_node)
    learners, rank = [], 0
    for b, size in enumerate(args.num_learners_per_node):
        for _ in range(size):
            strategy = PlacementGroupSchedulingStrategy(learner_pg, placement_group_bundle_index=b)
            learners.append(
                Learner.options(scheduling_strategy=strategy, num_gpus=1 if gpus else 0, num_cpus=0).remote(
                    rank, world, cuda
                )
            )
            rank += 1
    engines = [
        Engine.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(engine_pg, placement_group_bundle_index=i),
            num_gpus=tp if gpus else 0,
            num_cpus=tp,
        ).remote(model_dir, backend, cuda, args.seed + i)
        for i in range(args.vllm_num_engines)
    ]
    return learners, engines


def generate(engines: list, prompts: list[list[int]], args: argparse.Namespace, step: int) -> list[list[int]]:
    """Every prompt's group of responses, the prompts split over the engines."""
    share = -(-len(prompts) // len(engines))
    parts = [prompts[i * share : (i + 1) * share] for i in range(len(engines))]
    seed = args.seed * 1_000_003 + step
    die = {0: 0.05} if step == args.kill_engine_at_step else {}  # (seconds into its generate)
    refs = [
        e.generate.remote(p, args.group_size, tiny.RESPONSE_LEN, seed + i, die.get(i))
        for i, (e, p) in enumerate(zip(engines, parts, strict=True))
        if p
    ]
    return [resp for groups in ray.get(refs) for group in groups for resp in group]


def sync(learners: list, engines: list, names_shapes: list) -> tuple[float, list[float]]:
    """Push the learners' weights into every engine; both sides' checksums."""
    receiving = [e.update_weights.remote(names_shapes) for e in engines]
    sending = [lr.broadcast_weights.remote() for lr in learners]
    # NOTE: every call at once, the first failure raised as it comes: an engine that dies here
    # (a GPU fault, the OOM killer) leaves its learner waiting in the NCCL broadcast for ever, and
    # a wait on the learners first would never see the engine's death.
    pending = [*sending, *receiving]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)
    return float(ray.get(sending)[0]), [float(x) for x in ray.get(receiving)]


def main() -> int:
    args = parse()
    if not args.dir or not os.path.isabs(args.dir):
        print("grpo_tiny: need an absolute output folder (outputs.checkpoints or --dir)", file=sys.stderr)
        return 2
    ray.init()
    signal.signal(
        signal.SIGTERM, on_term
    )  # NOTE: after ray.init, which installs a SIGTERM handler of its own
    import torch

    gpus = ray.cluster_resources().get("GPU", 0) > 0
    cuda = gpus and torch.cuda.is_available()
    backend = args.rollouts if args.rollouts != "auto" else ("vllm" if vllm_available() else "torch")
    nccl = cuda and not (args.single_gpu_mode and gpus)  # (NCCL cannot join two ranks on one GPU)
    out = Path(args.dir)
    model_dir = out / "model"
    if not (model_dir / "config.json").exists():
        tiny.build(model_dir, args.seed)
    t0 = time.time()
    learners, engines = place_actors(args, gpus, cuda, backend, str(model_dir))
    infos = ray.get([e.info.remote() for e in engines])
    engine_start = time.time() - t0
    print(f"grpo_tiny: {len(engines)} {backend} engines up in {engine_start:.1f}s: {infos}", flush=True)
    master = ray.get(learners[0].endpoint.remote())
    per_learner = args.prompts_per_step * args.group_size // len(learners)
    start = ray.get(
        [lr.setup.remote(master, str(model_dir), args.lr, per_learner, str(out / "ckpt")) for lr in learners]
    )[0]
    _, port = free_endpoint()
    world = 1 + len(engines)
    host = ray.get(learners[0].endpoint.remote())[0]
    ray.get(
        [learners[0].init_weight_group.remote(port, world, nccl)]
        + [e.init_weight_group.remote(host, port, i + 1, world, nccl) for i, e in enumerate(engines)]
    )
    names_shapes = ray.get(learners[0].names_shapes.remote())
    sync(learners, engines, names_shapes)  # the engines start from the learners' weights (a resumed run too)
    print(f"grpo_tiny: starting at step {start} (resumed: {start > 0}), rollouts: {backend}", flush=True)
    rows, checksums, step, learner_hosts, learner_gpus = [], [], start, [], []
    while step < args.steps and not stopping:
        prompts = tiny.prompts(step, args.prompts_per_step, args.seed)
        t = time.time()
        responses = generate(engines, prompts, args, step)
        gen_s = time.time() - t
        expanded = [p for p in prompts for _ in range(args.group_size)]
        rewards = [tiny.reward(p, r) for p, r in zip(expanded, responses, strict=True)]
        adv = tiny.advantages(rewards, args.group_size)
        seqs = [p + r for p, r in zip(expanded, responses, strict=True)]
        n = len(seqs) // len(learners)
        t = time.time()
        trained = ray.get(
            [
                lr.train.remote(seqs[i * n : (i + 1) * n], adv[i * n : (i + 1) * n], args.epochs)
                for i, lr in enumerate(learners)
            ]
        )
        train_s = time.time() - t
        learner_hosts = sorted({t["host"] for t in trained})
        learner_gpus = sorted({g for t in trained for g in t["gpus"]})
        t = time.time()
        sent, received = sync(learners, engines, names_shapes)
        sync_s = time.time() - t
        step += 1
        if step % args.checkpoint_every == 0 or step == args.steps or stopping:
            ray.get([lr.save.remote(step) for lr in learners])
        row = {
            "step": step,
            "reward": round(statistics.mean(rewards), 4),
            "gen_s": round(gen_s, 3),
            "train_s": round(train_s, 3),
            "sync_s": round(sync_s, 3),
            "checksum_learner": sent,
            "checksum_engines": received,
        }
        rows.append(row)
        checksums.append(sent)
        print("GRPO_STEP " + json.dumps(row), flush=True)
    median = lambda key: round(statistics.median(r[key] for r in rows), 3) if rows else None  # noqa: E731
    summary = {
        "rollouts": backend,
        "device": "cuda" if cuda else "cpu",
        "sync_backend": "nccl" if nccl else "gloo",  # the learner -> engines weight broadcast
        "single_gpu_mode": bool(args.single_gpu_mode and gpus),
        "engines": len(engines),
        "learners": len(learners),
        "learner_hosts": learner_hosts,
        "engine_hosts": sorted({i["host"] for i in infos}),
        "learner_gpus": learner_gpus,
        "engine_gpus": sorted({g for i in infos for g in i["gpu_ids"]}),
        "engine_start_s": round(engine_start, 1),
        "start_step": start,
        "end_step": step,
        "stopped": stopping,
        "rewards": [r["reward"] for r in rows],
        "median_s": {k: median(k) for k in ("gen_s", "train_s", "sync_s")},
        "weights_synced_every_step": all(
            r["checksum_engines"] == [r["checksum_learner"]] * len(engines) for r in rows
        ),
        "weights_changed_every_step": all(a != b for a, b in itertools.pairwise(checksums)),
    }
    print("GRPO " + json.dumps(summary), flush=True)
    if stopping:
        print(f"grpo_tiny: stopped at step {step}; checkpoint saved", flush=True)
        return 143
    return 0


if __name__ == "__main__":
    sys.exit(main())
