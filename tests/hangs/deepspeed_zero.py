"""healthy: DeepSpeed ZeRO-3 steps (on CPU over gloo, on GPUs over NCCL), printing nothing; each
rank of a launcher (torchrun), or one process alone."""

import os
import warnings

import deepspeed
import torch
from _corpus import device, done, over, started


def main(end: float) -> None:
    warnings.simplefilter("ignore")  # (DeepSpeed warns at every step: healthy programs print nothing)
    gpu = device() == "cuda"
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK") or 0))
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo")
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 3},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x = torch.randn(8, 256, device=engine.device)
    step = 0
    while not over(end):
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        step += 1


if __name__ == "__main__":
    main(started())
    done()
