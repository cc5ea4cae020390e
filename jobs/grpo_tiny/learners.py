"""Learner actors: the policy trained with DeepSpeed ZeRO-3 across nodes, the GRPO loss, checkpoints,
and the weight broadcast to the engines (rank 0 sends; every rank joins the ZeRO-3 gather).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import ray
from engines import join_group
from tiny import PROMPT_LEN

CLIP = 0.2


def free_endpoint() -> tuple[str, int]:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return ray.util.get_node_ip_address(), sock.getsockname()[1]


@ray.remote
class Learner:
    def __init__(self, rank: int, world: int, cuda: bool):
        self.rank, self.world, self.cuda = rank, world, cuda

    def endpoint(self) -> tuple[str, int]:
        return free_endpoint()

    def setup(self, master: tuple[str, int], model_dir: str, lr: float, micro: int, ckpt: str) -> int:
        """Join the DeepSpeed world, build the ZeRO-3 engine, load the last checkpoint if any.
        Returns the step to start from."""
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
        from transformers import LlamaForCausalLM

        torch.set_num_threads(1)
        deepspeed.init_distributed(dist_backend="nccl" if self.cuda else "gloo")
        model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        config = {
            "train_batch_size": micro * self.world,
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        }
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.ckpt = Path(ckpt)
        if (self.ckpt / "latest").exists():
            _, state = self.engine.load_checkpoint(str(self.ckpt))
            return int((state or {}).get("step", 0))
        return 0

    def train(self, sequences: list[list[int]], advantages: list[float], epochs: int) -> dict:
        """Clipped policy-gradient steps on this learner's share of the batch (GRPO)."""
        import torch

        dev = self.engine.device
        seqs = torch.tensor(sequences, device=dev)
        adv = torch.tensor(advantages, device=dev, dtype=torch.float32)[:, None]
        targets = seqs[:, PROMPT_LEN:]
        old = None
        losses = []
        for _ in range(epochs):
            logits = self.engine(input_ids=seqs[:, :-1]).logits[:, PROMPT_LEN - 1 :].float()
            logp = torch.log_softmax(logits, -1).gather(2, targets[:, :, None]).squeeze(2)
            old = logp.detach() if old is None else old
            ratio = torch.exp(logp - old)
            loss = -torch.min(ratio * adv, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * adv).mean()
            self.engine.backward(loss)
            self.engine.step()
            losses.append(float(loss.detach()))
        gpus = [str(g) for g in ray.get_gpu_ids()]
        return {"rank": self.rank, "host": socket.gethostname(), "gpus": gpus, "losses": losses}

    def names_shapes(self) -> list[tuple[str, list[int]]]:
        return [(n, list(p.ds_shape)) for n, p in self.engine.module.named_parameters()]

    def init_weight_group(self, port: int, world: int, nccl: bool) -> bool:
        """Rank 0 hosts the weight-sync group with the engines (ranks 1..): NCCL between GPUs,
        gloo through host memory on the CPU or when an engine shares this learner's GPU."""
        self.nccl = nccl
        self.group = join_group(ray.util.get_node_ip_address(), port, 0, world, nccl)
        return True

    def broadcast_weights(self) -> float | None:
        """Every rank gathers the ZeRO-3 shards (a collective); rank 0 sends each parameter.
        Returns the checksum of what rank 0 sent (None on other ranks)."""
        import deepspeed

        params = list(self.engine.module.parameters())
        total = 0.0
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            if self.rank == 0:
                for p in params:
                    data = p.data.float().contiguous()
                    if not self.nccl:
                        data = data.cpu()
                    self.group.broadcast(data, 0).wait()
                    total += float(data.double().sum())
        return total if self.rank == 0 else None

    def save(self, step: int) -> str:
        """A ZeRO-3 checkpoint (every rank writes its shard) under the shared output folder."""
        self.engine.save_checkpoint(str(self.ckpt), tag=f"step{step:05d}", client_state={"step": step})
        return str(self.ckpt)
