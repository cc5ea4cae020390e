"""Whether this node has a GPU driver: where it has none, torch sees no GPU, so the debug jobs
do not spend seconds of the node's CPU importing torch to be told so."""

from __future__ import annotations

import os

DEVICES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")  # NVIDIA's, and AMD's ROCm


def gpu_driver_here() -> bool:
    return any(map(os.path.exists, DEVICES))
