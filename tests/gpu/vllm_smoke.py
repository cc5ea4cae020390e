"""A minute's check that the staged vLLM runs here before the suite spends its time: the tiny
model of grpo_tiny, one engine on the GPU, a batch of samples, the weights loaded once more
through the worker as grpo_tiny does after every step. Prints `VLLM_SMOKE {json}`."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "jobs" / "grpo_tiny"))


def main() -> int:
    import tiny
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.time()
    folder = Path(tempfile.mkdtemp(prefix="vllm-smoke-"))
    model = tiny.build(folder / "model")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # (flashinfer is not staged)
    llm = LLM(
        model=str(model), dtype="float32", enforce_eager=True, max_model_len=32, gpu_memory_utilization=0.2
    )
    started = time.time() - t0
    params = SamplingParams(n=8, temperature=1.0, max_tokens=tiny.RESPONSE_LEN, ignore_eos=True, seed=0)
    t1 = time.time()
    outs = llm.generate([{"prompt_token_ids": p} for p in tiny.prompts(0, 4)], params, use_tqdm=False)
    gen = time.time() - t1
    samples = sum(len(o.outputs) for o in outs)
    print(
        "VLLM_SMOKE "
        + json.dumps(
            {
                "vllm": vllm.__version__,
                "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(0),
                "engine_start_s": round(started, 1),
                "generate_s": round(gen, 3),
                "samples": samples,
            }
        ),
        flush=True,
    )
    return 0 if samples == 32 else 1


if __name__ == "__main__":
    sys.exit(main())
