"""healthy: a vLLM engine generating one long batch (one `generate` call that lasts the whole
time, printing nothing), its engine in this process as RL frameworks run one of TP 1 (GPU suite)."""

import os
import tempfile
import time
from pathlib import Path

from _corpus import done, seconds, started

WORDS = ["<pad>", "<s>", "</s>", "<unk>", *[f"w{i}" for i in range(60)]]


def build(folder: Path) -> Path:
    """A randomly initialised Llama-shaped model and a word-level tokenizer (no model hub)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    config = LlamaConfig(
        hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=8,
        num_hidden_layers=4, vocab_size=len(WORDS), max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    end = started()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from vllm import LLM, SamplingParams

    model = build(Path(tempfile.mkdtemp(prefix="corpus-vllm-")) / "model")
    llm = LLM(model=str(model), dtype="bfloat16", max_model_len=4096, gpu_memory_utilization=0.3)
    prompts = [{"prompt_token_ids": [1, 4 + i % 60]} for i in range(64)]
    t = time.time()
    llm.generate(prompts, SamplingParams(max_tokens=256, ignore_eos=True), use_tqdm=False)
    rate = 64 * 256 / max(time.time() - t, 1e-3)  # (tokens a second, with 64 sequences)
    n = max(64, int(2 * rate * max(end - time.time(), seconds() / 3) / 3000))  # (twice: a busy GPU)
    prompts = [{"prompt_token_ids": [1, 4 + i % 60]} for i in range(n)]
    llm.generate(prompts, SamplingParams(max_tokens=3000, ignore_eos=True), use_tqdm=False)
    done()
