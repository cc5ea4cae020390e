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
import itertools
import json
import os
import socket
import statistics
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


def dataset(count: int, seed: int):  # (a datasets.Dataset)
    from datasets import Dataset

    rows = [" ".join(WORD_OF[t] for t in p[1:]) for p in tiny.prompts(0, count, seed)]
    return Dataset.from_dict({"prompt": rows})


def model_dir(out: str, seed: int) -> Path:
    """The tiny model, built once per node (its local rank 0), in a folder of the node's own."""
    folder = Path(out) / f"model-{socket.gethostname()}"
    done = folder / "raystack-tiny.json"
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 and not done.exists():
        tiny.build(folder, seed)
    deadline = time.time() + 300
    while not done.exists() and time.time() < deadline:
        time.sleep(0.2)
    return folder


def config_from(argv: list[str], out: Path):  # (a trl.GRPOConfig)
    """TRL's GRPOConfig from TRL's own flags, as TRL's scripts read them (HfArgumentParser): the
    flags the planner fills in go to TRL as they are. The toy's own settings come first and any
    flag given wins; without CUDA, what a CPU needs comes last."""
    import torch
    from transformers import HfArgumentParser
    from trl import GRPOConfig

    toy = [
        f"--output_dir={out}", f"--max_completion_length={tiny.RESPONSE_LEN}", "--temperature=1.0",
        "--beta=0.0", "--learning_rate=3e-3", "--logging_steps=1", "--save_strategy=no", "--report_to=none",
        "--num_generations=8",
    ]  # fmt: skip
    cpu = [] if torch.cuda.is_available() else ["--use_cpu=True", "--bf16=False"]  # (checked when parsed)
    (config,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses([*toy, *argv, *cpu])
    return config


def main() -> int:
    p = argparse.ArgumentParser(description="the toy's own flags; every other flag is TRL's GRPOConfig's")
    p.add_argument("--dir", default=os.environ.get("RAYSTACK_OUTPUT_RUN") or "/tmp/trl-grpo")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--model-seed", type=int, default=0)
    ours, trl_flags = p.parse_known_args()
    from trl import GRPOTrainer

    # NOTE: before TRL's config, which starts the distributed state: from then on transformers'
    # save_pretrained writes on the main process only, and the other nodes' models stay empty.
    folder = model_dir(ours.dir, ours.model_seed)
    config = config_from(trl_flags, Path(ours.dir) / "out")
    ends: list[float] = []
    trainer = GRPOTrainer(
        model=str(folder),
        reward_funcs=say_reward,
        args=config,
        train_dataset=dataset(ours.prompts, config.seed),
        callbacks=[step_clock(ends)],
    )
    t0 = time.time()
    trainer.train()
    if trainer.accelerator.is_main_process:
        print("TRL_GRPO " + json.dumps(summary(trainer, time.time() - t0, ends)), flush=True)
    return 0


def step_clock(ends: list[float]):  # (a transformers.TrainerCallback)
    """Notes when each optimizer step ends: the per-step time, beside a run started another way."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            ends.append(time.monotonic())

    return StepClock()


def summary(trainer, seconds: float, ends: list[float]) -> dict:  # (trainer: a trl.GRPOTrainer)
    """What TRL really ran: its batch as the trainer holds it, what it logged, and the median
    time of a step after the first (the first pays for compilation and warm-up)."""
    logged = [h for h in trainer.state.log_history if "reward" in h]
    steps = [b - a for a, b in itertools.pairwise(ends)]
    args, acc = trainer.args, trainer.accelerator
    plugin = acc.state.deepspeed_plugin
    return {
        "steps": trainer.state.global_step,
        "processes": acc.num_processes,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "effective_batch": args.per_device_train_batch_size
        * args.gradient_accumulation_steps
        * acc.num_processes,
        "num_generations": args.num_generations,
        "deepspeed": plugin is not None,
        "zero_stage": plugin.zero_stage if plugin else None,
        "rewards": [round(h["reward"], 4) for h in logged],
        "losses": [round(h["loss"], 6) for h in logged if "loss" in h],
        "use_vllm": args.use_vllm,
        "vllm_mode": args.vllm_mode if args.use_vllm else None,
        "step_s_median": round(statistics.median(steps), 4) if steps else None,
        "seconds": round(seconds, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
