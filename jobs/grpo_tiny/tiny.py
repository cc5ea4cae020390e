"""The tiny policy and its task, made locally (no model hub).

Model: a Llama-shaped transformer (hidden 128, 2 layers, 2 heads of 64: vLLM's CPU attention
needs head_dim 64), randomly initialised, with a word-level tokenizer of 15 words.
Task ("say d"): the prompt is `<s> say d` for a digit d; the response is 4 tokens; the reward is
the share of response tokens equal to d. A random policy scores about 1/15; a policy that has
learnt the task scores 1. Verifiable, learnable from scratch in a few dozen steps on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["<pad>", "<s>", "</s>", "<unk>", "say", *[str(d) for d in range(10)]]
BOS, SAY, FIRST_DIGIT = 1, 4, 5
PROMPT_LEN, RESPONSE_LEN = 3, 4


def build(folder: Path, seed: int = 0) -> Path:
    """Write a fresh model and tokenizer to `folder` (HF format: what vLLM and transformers load)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=len(WORDS),
        max_position_embeddings=64,
        bos_token_id=BOS,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    (folder / "raystack-tiny.json").write_text(json.dumps({"task": "say d", "seed": seed}))
    return folder


def prompts(step: int, count: int, seed: int = 0) -> list[list[int]]:
    """The prompts of one step (the same for a step whoever asks: a resumed run repeats nothing)."""
    import random

    rng = random.Random(seed * 100_003 + step)
    return [[BOS, SAY, FIRST_DIGIT + rng.randrange(10)] for _ in range(count)]


def reward(prompt: list[int], response: list[int]) -> float:
    target = prompt[-1]
    return sum(1 for t in response if t == target) / max(1, len(response))


def advantages(rewards: list[float], group: int) -> list[float]:
    """GRPO: each reward against its group's (same prompt) mean, over the group's spread."""
    out = []
    for i in range(0, len(rewards), group):
        chunk = rewards[i : i + group]
        mean = sum(chunk) / len(chunk)
        std = (sum((r - mean) ** 2 for r in chunk) / max(1, len(chunk) - 1)) ** 0.5
        out += [(r - mean) / (std + 1e-4) for r in chunk]
    return out
