"""accel_ds: a few training steps through Hugging Face accelerate with a DeepSpeed config.

Launched with `accelerate launch --use_deepspeed --deepspeed_config_file ds_config.json ...`
(`kind: spmd, launcher: accelerate`): every rank reports its place; rank 0 prints the losses.
"""

from __future__ import annotations

import socket

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from ranks import leave, report


def main() -> int:
    # Without CUDA, accelerate finds no backend for DeepSpeed and runs every process alone
    # (world 1); naming gloo makes it use the process group the launcher set up.
    handlers = [] if torch.cuda.is_available() else [InitProcessGroupKwargs(backend="gloo")]
    acc = Accelerator(kwargs_handlers=handlers)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(acc.process_index)
    x = torch.randn(64, 16, generator=gen)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4
    )
    net, opt, loader = acc.prepare(net, opt, loader)
    losses = []
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(net(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(round(float(loss), 5))
    info = {
        "rank": acc.process_index,
        "world": acc.num_processes,
        "host": socket.gethostname(),
        "type": str(acc.distributed_type),
    }
    report("ACCEL_RANK", info)
    if acc.is_main_process:
        report("ACCEL", {"world": acc.num_processes, "steps": len(losses), "losses": losses[:3]})
    # Every rank leaves the process group together, then exits without the interpreter's
    # teardown (ranks.leave says why).
    acc.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    leave(main())
