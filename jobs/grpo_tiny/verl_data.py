"""verl_data: what verl_grpo.yaml hands to verl (no hub, no download): the tiny random model of
grpo_tiny (tiny.py) with a chat template, and the "say d" prompts as verl's parquet rows.

verl reads a prompt as chat messages (`prompt: [{role, content}]`), applies the tokenizer's chat
template, and gives its reward function the row's `data_source` and `reward_model.ground_truth`
(verl_reward.py scores them). Written once per folder: a second job reuses them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tiny  # (this folder)

# The prompt as the toy's words, nothing added: "<s> say 3" -> tokens [<s>, say, 3].
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def rows(count: int, seed: int) -> list[dict]:
    out = []
    for i, p in enumerate(tiny.prompts(0, count, seed)):
        digit = tiny.WORDS[p[-1]]
        out.append(
            {
                "data_source": "raystack/say_d",
                "prompt": [{"role": "user", "content": f"<s> say {digit}"}],
                "ability": "say",
                "reward_model": {"style": "rule", "ground_truth": digit},
                "extra_info": {"index": i},
            }
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    import pandas as pd
    from transformers import AutoTokenizer

    model = args.folder / "model"
    if not (model / "raystack-tiny.json").exists():
        tiny.build(model, args.seed)
        tok = AutoTokenizer.from_pretrained(model)
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(model)
    for name, count, seed in (("train", args.prompts, args.seed), ("val", 32, args.seed + 1)):
        path = args.folder / f"{name}.parquet"
        if not path.exists():
            pd.DataFrame(rows(count, seed)).to_parquet(path)
    print(f"verl data: {model}, {args.folder / 'train.parquet'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
