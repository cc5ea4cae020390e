"""hung: a DataLoader whose worker never returns a batch (its dataset waits on a file that never
comes): the loop waits in the loader, which retries its queue every 5 s."""

import os
import time

import torch
from _corpus import started


class Waits(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        while not os.path.exists("/nonexistent/corpus-ready"):
            time.sleep(0.5)
        return torch.zeros(4)


if __name__ == "__main__":
    started()
    for batch in torch.utils.data.DataLoader(Waits(), batch_size=8, num_workers=2):
        batch.sum()
