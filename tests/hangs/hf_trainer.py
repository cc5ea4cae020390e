"""healthy: HF Trainer with logging off (`disable_tqdm`, no logging or saving steps) training a
GPT-2-shaped model on random tokens: tiny on a CPU, GPT-2-sized in bf16 on a GPU; one rank, or
each rank of torchrun."""

import torch
from _corpus import device, done, over, started
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StopAt(TrainerCallback):
    def __init__(self, end: float):
        self.end = end

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        control.should_training_stop = over(self.end)
        return control


if __name__ == "__main__":
    end = started()
    gpu = device() == "cuda"
    shape = {"n_layer": 12, "n_embd": 768, "n_head": 12} if gpu else {"n_layer": 2, "n_embd": 64, "n_head": 2}
    model = GPT2LMHeadModel(GPT2Config(vocab_size=1000 if not gpu else 50257, n_positions=512, **shape))
    args = TrainingArguments(
        output_dir="/tmp/corpus-hf",
        per_device_train_batch_size=8,
        max_steps=10**6,
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        bf16=gpu,
        use_cpu=not gpu,
        dataloader_num_workers=0,
    )
    data = Tokens(4096, 256 if gpu else 64, model.config.vocab_size)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[StopAt(end)]).train()
    done()
