"""healthy: checkpoint writes of a large tensor (torch.save, one line at the top level: the writing
happens in torch's C++ writer, where no Python frame moves)."""

import os
import tempfile
import time

import torch
from _corpus import done, started

end = started()
big = torch.randn(64 << 20)  # 256 MiB
path = os.path.join(tempfile.mkdtemp(prefix="corpus-ckpt-"), "step.pt")
while time.time() < end:
    torch.save({"weights": big}, path)
os.remove(path)
done()
