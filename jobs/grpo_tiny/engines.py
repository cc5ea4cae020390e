"""Rollout engines as Ray actors: vLLM (the real thing), or plain torch sampling where vLLM is not
installed (the job says which it used).

Weights reach the engines as open-instruct sends them: learner rank 0 and every engine form a
process group of their own (gloo on CPU, NCCL on GPUs), and rank 0 broadcasts each parameter
after each step. With one GPU for both (`--single_gpu_mode`: the learner and the engine share
it, as open-instruct colocates them) NCCL cannot join two processes on one device, so the same
broadcast goes over gloo through host memory. In a vLLM engine the receiving end runs inside
vLLM's worker process (a `worker_extension_cls`), and the weights are loaded through vLLM's own
layerwise reload where vLLM has it (initialize_layerwise_reload -> load_weights ->
finalize_layerwise_reload: plain `model.load_weights` fails on CPU, whose kernels repack the
weights after the first load); older vLLMs (0.2x, on CUDA) load them directly.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from typing import Any

import ray

GROUP_TIMEOUT = timedelta(minutes=10)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def join_group(host: str, port: int, rank: int, world: int, nccl: bool) -> Any:
    """A process group of `world` ranks outside torch.distributed's default one."""
    import torch.distributed as dist

    store = dist.TCPStore(
        host, port, world, is_master=rank == 0, wait_for_workers=False, timeout=GROUP_TIMEOUT
    )
    if nccl:
        return dist.ProcessGroupNCCL(store, rank, world)
    return dist.ProcessGroupGloo(store, rank, world, GROUP_TIMEOUT)


def receive(
    group: Any, names_shapes: list[tuple[str, list[int]]], device: str, nccl: bool
) -> tuple[list[tuple[str, Any]], float]:
    """Receive every parameter rank 0 broadcasts (into host memory over gloo, into the device over
    NCCL), on `device`; return them and their checksum."""
    import torch

    weights, total = [], 0.0
    for name, shape in names_shapes:
        tensor = torch.empty(shape, dtype=torch.float32, device=device if nccl else "cpu")
        group.broadcast(tensor, 0).wait()
        weights.append((name, tensor.to(device)))
        total += float(tensor.double().sum())
    return weights, total


class WeightSync:
    """vLLM worker_extension_cls: these methods run inside vLLM's worker process (their names must
    not clash with the worker's own: vLLM 0.32 has an `update_weights` of its own)."""

    def tiny_init_weight_group(self, host: str, port: int, rank: int, world: int, nccl: bool) -> bool:
        self._weight_group = join_group(host, port, rank, world, nccl)
        return True

    def tiny_update_weights(self, names_shapes: list[tuple[str, list[int]]], cuda: bool, nccl: bool) -> float:
        weights, checksum = receive(self._weight_group, names_shapes, "cuda" if cuda else "cpu", nccl)
        model = self.model_runner.model  # type: ignore[attr-defined]
        try:
            from vllm.model_executor.model_loader.reload import (
                finalize_layerwise_reload,
                initialize_layerwise_reload,
            )
        except ImportError:  # (vLLM 0.2x: no layerwise reload; on CUDA load_weights is enough)
            model.load_weights(weights=weights)
            return checksum
        initialize_layerwise_reload(model)
        model.load_weights(weights=weights)
        finalize_layerwise_reload(model, self.model_runner.model_config)  # type: ignore[attr-defined]
        return checksum


@ray.remote
class Engine:
    """One rollout engine: generates groups of samples, takes new weights after each step."""

    def __init__(self, model_dir: str, backend: str, cuda: bool, seed: int, memory: float = 0.2):
        """`memory`: vLLM's share of the GPU (capped when the engine shares its GPU with a learner)."""
        self.backend, self.cuda, self.seed = backend, cuda, seed
        self.nccl = cuda
        t0 = time.time()
        if backend == "vllm":
            # NOTE: vLLM finds its own address by routing towards a public one; a node without a
            # default route (the testbed's) ends up with 0.0.0.0: give it Ray's.
            os.environ.setdefault("VLLM_HOST_IP", ray.util.get_node_ip_address())
            if importlib.util.find_spec("flashinfer") is None:  # (vLLM 0.22 samples with it by default)
                os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
            if not cuda:
                os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GB of RAM for the KV cache
            # The engine core and its one worker in this actor's process, as RL frameworks run an
            # engine of TP 1 (SkyRL, OpenRLHF): vLLM's default starts two more processes, each
            # importing torch and vLLM again (about 40 of an engine's 65 s start on the testbed),
            # and a fault of the actor then ends the whole engine at once.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            from vllm import LLM

            self.llm = LLM(
                model=model_dir,
                dtype="float32",
                enforce_eager=True,
                max_model_len=32,
                gpu_memory_utilization=0.1 if not cuda else memory,
                enable_prefix_caching=False,  # prompts repeat: never serve KV cached under old weights
                seed=seed,
                worker_extension_cls="engines.WeightSync",
                distributed_executor_backend="uni",
            )
        else:
            import torch
            from transformers import LlamaForCausalLM

            self.device = "cuda" if cuda else "cpu"
            self.model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to(
                self.device
            )
            self.model.eval()
        self.started_in = time.time() - t0

    def info(self) -> dict:
        return {
            "backend": self.backend,
            "start_s": self.started_in,
            "host": socket.gethostname(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }

    def generate(
        self, prompts: list[list[int]], n: int, max_tokens: int, seed: int, die_in: float | None = None
    ) -> list[list[list[int]]]:
        """`n` sampled responses (token ids) per prompt, temperature 1. `die_in`: this engine's
        process is killed (SIGKILL) that many seconds into the call, as a GPU fault or the
        out-of-memory killer would end it in the middle of a step."""
        if die_in is not None:
            print(f"GRPO_FAULT engine pid {os.getpid()} dies in {die_in:g}s t={time.time():.3f}", flush=True)
            threading.Timer(die_in, os.kill, (os.getpid(), signal.SIGKILL)).start()
        if self.backend == "vllm":
            from vllm import SamplingParams

            params = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=seed)
            outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return [[list(c.token_ids) for c in o.outputs] for o in outs]
        import torch

        gen = torch.Generator(device=self.device).manual_seed(seed)
        seqs = torch.tensor(prompts, device=self.device).repeat_interleave(n, 0)
        with torch.no_grad():
            for _ in range(max_tokens):
                probs = torch.softmax(self.model(seqs).logits[:, -1].float(), -1)
                seqs = torch.cat([seqs, torch.multinomial(probs, 1, generator=gen)], 1)
        responses = seqs[:, len(prompts[0]) :].tolist()
        return [responses[i * n : (i + 1) * n] for i in range(len(prompts))]

    def init_weight_group(self, host: str, port: int, rank: int, world: int, nccl: bool) -> bool:
        self.nccl = nccl
        if self.backend == "vllm":
            return bool(
                self.llm.collective_rpc("tiny_init_weight_group", args=(host, port, rank, world, nccl))[0]
            )
        self.group = join_group(host, port, rank, world, nccl)
        return True

    def update_weights(self, names_shapes: list[tuple[str, list[int]]]) -> float:
        """Take the weights learner rank 0 broadcasts; return their checksum as received."""
        if self.backend == "vllm":
            args = (names_shapes, self.cuda, self.nccl)
            return float(self.llm.collective_rpc("tiny_update_weights", args=args)[0])
        import torch

        weights, checksum = receive(self.group, names_shapes, self.device, self.nccl)
        with torch.no_grad():
            params = dict(self.model.named_parameters())
            for name, tensor in weights:
                params[name].copy_(tensor)
        return checksum
