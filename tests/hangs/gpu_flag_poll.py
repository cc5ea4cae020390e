"""hung: a loop that polls a flag on the GPU that nothing will ever set (a kernel's result that never
comes, a hand-made barrier): a full CPU core and a busy GPU, the same line forever."""

import torch
from _corpus import device, started

if __name__ == "__main__":
    started()
    flag = torch.zeros(1, dtype=torch.int32, device=device())
    while flag.item() == 0:
        pass
