"""Memory per GPU: a DeepSpeed ZeRO-3 learner, and a vLLM engine. Pure arithmetic, in GB (1e9).

Learner (ZeRO-3 over N learners, bf16 weights, AdamW):
  parameters   2 P / N        bf16 shards
  gradients    2 P / N        bf16 shards
  optimizer   12 P / N        fp32 master weights + Adam's m and v (DeepSpeed's bf16 mixed
                              precision keeps the master copy; the 32B write-up counts only m and v,
                              8 P / N: `optimizer_bytes=8` reproduces its tables exactly)
  live params  2 min(P, 1e9)  stage3_max_live_parameters: layers gathered for compute
  activations                 with gradient checkpointing: every layer's input (2 s b h bytes
                              per layer), one layer's working set (~34 s b h, flash attention),
                              and the fp32 logits of the micro-batch (4 s b V)
vLLM engine (TP GPUs): vLLM takes `gpu_memory_utilization` of each GPU; the weights (2 P / TP)
come first, the KV cache gets the rest (2 layers x kv_heads x head_dim x 2 bytes per token).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GB = 1e9


@dataclass(frozen=True)
class Model:
    """What the arithmetic needs to know about a transformer."""

    name: str
    params: float  # count
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# Published configs (config.json of each model on its hub page).
MODELS = {
    "olmo2-7b": Model("OLMo-2 7B", 7.30e9, 4096, 32, 100352, 32, 32),
    "olmo2-13b": Model("OLMo-2 13B", 13.7e9, 5120, 40, 100352, 40, 40),
    "olmo2-32b": Model("OLMo-2 32B", 32.2e9, 5120, 64, 100352, 40, 8),
    "qwen2.5-0.5b": Model("Qwen2.5 0.5B", 0.49e9, 896, 24, 151936, 14, 2),
    "qwen2.5-1.5b": Model("Qwen2.5 1.5B", 1.54e9, 1536, 28, 151936, 12, 2),
    "qwen2.5-7b": Model("Qwen2.5 7B", 7.62e9, 3584, 28, 152064, 28, 4),
    "qwen2.5-32b": Model("Qwen2.5 32B", 32.8e9, 5120, 64, 152064, 40, 8),
}
ALIASES = {"7b": "olmo2-7b", "13b": "olmo2-13b", "32b": "olmo2-32b"}


def model(name: str) -> Model:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        raise ValueError(
            f"unknown model '{name}': one of {', '.join([*ALIASES, *MODELS])}, or give its sizes"
        )
    return MODELS[key]


@dataclass(frozen=True)
class LearnerMemory:
    model: str
    learners: int
    parameters: float
    gradients: float
    optimizer: float
    live_parameters: float
    activations: float
    gpu_memory: float
    warn_fraction: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer + self.live_parameters + self.activations

    @property
    def fraction(self) -> float:
        return self.total / self.gpu_memory

    @property
    def warning(self) -> str | None:
        if self.fraction <= self.warn_fraction:
            return None
        return (
            f"{self.total:.0f} GB of {self.gpu_memory:.0f} GB per learner GPU ({self.fraction:.0%}, over "
            f"{self.warn_fraction:.0%}): add learners, shorten sequences or micro-batches, or offload"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "fraction": self.fraction, "warning": self.warning}


def learner_memory(
    m: Model,
    learners: int,
    seq_len: int = 4096,
    micro_batch: int = 1,
    gpu_memory: float = 95.0,
    optimizer_bytes: int = 12,
    checkpointing: bool = True,
    max_live_params: float = 1e9,
    warn_fraction: float = 0.9,
) -> LearnerMemory:
    """GB per learner GPU under ZeRO-3 (see the module's docstring for every term)."""
    if learners < 1:
        raise ValueError("learners must be at least 1")
    shard = m.params / learners
    tokens = seq_len * micro_batch
    layer_inputs = 2 * tokens * m.hidden * m.layers if checkpointing else 34 * tokens * m.hidden * m.layers
    working = 34 * tokens * m.hidden if checkpointing else 0
    logits = 4 * tokens * m.vocab
    return LearnerMemory(
        model=m.name,
        learners=learners,
        parameters=2 * shard / GB,
        gradients=2 * shard / GB,
        optimizer=optimizer_bytes * shard / GB,
        live_parameters=2 * min(m.params, max_live_params) / GB,
        activations=(layer_inputs + working + logits) / GB,
        gpu_memory=gpu_memory,
        warn_fraction=warn_fraction,
    )


@dataclass(frozen=True)
class EngineMemory:
    model: str
    tp: int
    reserved_per_gpu: float
    weights_per_gpu: float
    kv_cache_per_gpu: float
    kv_bytes_per_token: float
    max_tokens: int
    max_sequences: int
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def engine_memory(
    m: Model,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    gpu_memory: float = 95.0,
    max_model_len: int = 8192,
) -> EngineMemory:
    """A vLLM engine's memory per GPU at `gpu_memory_utilization`, and what its KV cache holds."""
    if tp < 1 or not 0 < gpu_memory_utilization <= 1:
        raise ValueError("tp must be at least 1 and gpu_memory_utilization in (0, 1]")
    reserved = gpu_memory_utilization * gpu_memory
    weights = 2 * m.params / tp / GB
    kv_per_token = 2 * m.layers * m.kv_heads * m.head_dim * 2 / tp  # K and V, bf16, split over TP
    kv = max(0.0, reserved - weights)
    tokens = int(kv * GB / kv_per_token) if kv_per_token else 0
    return EngineMemory(
        model=m.name,
        tp=tp,
        reserved_per_gpu=reserved,
        weights_per_gpu=weights,
        kv_cache_per_gpu=kv,
        kv_bytes_per_token=kv_per_token,
        max_tokens=tokens,
        max_sequences=tokens // max_model_len if max_model_len else 0,
        fits=weights < reserved,
    )
