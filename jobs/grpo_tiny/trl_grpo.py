"""trl_grpo: TRL's own GRPOTrainer, unchanged, on the toy task of grpo_tiny (tiny.py: "say d").

Run by a launcher on every node (`kind: spmd, launcher: accelerate`, trl_grpo.yaml: DeepSpeed
ZeRO-2 as seed 002's RLCR runs use it): each rank builds nothing but the dataset (rank 0 of each
node builds the tiny random model and tokenizer locally, no hub), then TRL trains with the
per-device batch and gradient accumulation the planner filled in. At the end rank 0 prints
`TRL_GRPO {...}`: the steps, the reward and loss TRL logged, and the effective batch TRL really
used (its per-device batch x gradient accumulation x processes, read from the trainer).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import tiny  # (this folder: the task and the model builder grpo_tiny uses)

WORD_OF = {i: w for i, w in enumerate(tiny.WORDS)}


def say_reward(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    """The share of completion words equal to the digit the prompt asks for."""
    rewards = []
    for prompt, completion in zip(prompts, completions, strict=True):
        target = prompt.split()[-1]
        words = completion.split()[: tiny.RESPONSE_LEN]
        rewards.append(sum(1 for w in words if w == target) / tiny.RESPONSE_LEN)
    return rewards


def dataset(count: int, seed: int):  # noqa: ANN201 (datasets.Dataset)
    from datasets import Dataset

    rows = [" ".join(WORD_OF[t] for t in p[1:]) for p in tiny.prompts(0, count, seed)]
    return Dataset.from_dict({"prompt": rows})


def model_dir(args: argparse.Namespace) -> Path:
    """The tiny model, built once per node (its local rank 0) into a node-local folder."""
    folder = Path(args.dir) / f"model-{socket.gethostname()}"
    done = folder / "raystack-tiny.json"
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 and not done.exists():
        tiny.build(folder, args.seed)
    deadline = time.time() + 300
    while not done.exists() and time.time() < deadline:
        time.sleep(0.2)
    return folder


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--num_generations", type=int, default=8)
    p.add_argument("--max_steps", type=int, default=10)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default=os.environ.get("RAYSTACK_OUTPUT_RUN") or "/tmp/trl-grpo")
    args = p.parse_args()
    import torch
    from trl import GRPOConfig, GRPOTrainer

    folder = model_dir(args)
    config = GRPOConfig(
        output_dir=str(Path(args.dir) / "out"),
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        num_generations=args.num_generations,
        max_completion_length=tiny.RESPONSE_LEN,
        temperature=1.0,
        beta=0.0,  # (no reference model: the toy needs no KL term)
        learning_rate=args.learning_rate,
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        seed=args.seed,
    )
    trainer = GRPOTrainer(
        model=str(folder), reward_funcs=say_reward, args=config, train_dataset=dataset(512, args.seed)
    )
    t0 = time.time()
    trainer.train()
    if trainer.accelerator.is_main_process:
        logged = [h for h in trainer.state.log_history if "reward" in h]
        used = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
        summary = {
            "steps": trainer.state.global_step,
            "processes": trainer.accelerator.num_processes,
            "per_device_train_batch_size": trainer.args.per_device_train_batch_size,
            "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps,
            "effective_batch": used * trainer.accelerator.num_processes,
            "num_generations": trainer.args.num_generations,
            "deepspeed": trainer.accelerator.state.deepspeed_plugin is not None,
            "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage
            if trainer.accelerator.state.deepspeed_plugin
            else None,
            "rewards": [round(h["reward"], 4) for h in logged],
            "losses": [round(h["loss"], 6) for h in logged if "loss" in h],
            "seconds": round(time.time() - t0, 1),
        }
        print("TRL_GRPO " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
