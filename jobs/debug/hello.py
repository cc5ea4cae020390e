"""hello: what every node of the cluster looks like from inside a Ray job.

One task pinned to each alive node reports host, address, GPUs (Ray's and CUDA_VISIBLE_DEVICES),
CPUs and the Python / Ray / torch versions there. Exits 1 if a node cannot be reached, or if the
cluster has fewer nodes or GPUs than RAYSTACK_EXPECT_NODES / RAYSTACK_EXPECT_GPUS ask for.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import sys

import ray
from gpudriver import gpu_driver_here
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def torch_here() -> tuple[str, int]:
    """torch's version and the GPUs it sees (imported only where a GPU driver is)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed", 0
    if not gpu_driver_here():
        return version, 0
    import torch

    return torch.__version__, torch.cuda.device_count() if torch.cuda.is_available() else 0


@ray.remote(num_cpus=0)
def describe() -> dict:
    torch_version, cuda = torch_here()
    return {
        "host": socket.gethostname(),
        "ip": ray.util.get_node_ip_address(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch_version,
        "cuda_devices_torch_sees": cuda,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }


def main() -> int:
    ray.init()
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = [
        describe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in nodes
    ]
    reports = ray.get(refs, timeout=300)
    total = ray.cluster_resources()
    print(f"{'host':10} {'ip':15} {'GPUs':>4} {'CPUs':>4}  python  ray     torch")
    for node, rep in sorted(zip(nodes, reports, strict=True), key=lambda x: x[1]["host"]):
        res = node["Resources"]
        print(
            f"{rep['host']:10} {rep['ip']:15} {res.get('GPU', 0):>4.0f} {res.get('CPU', 0):>4.0f}  "
            f"{rep['python']:7} {rep['ray']:7} {rep['torch']}"
        )
    summary = {
        "nodes": len(nodes),
        "gpus": total.get("GPU", 0),
        "cpus": total.get("CPU", 0),
        "per_node": reports,
    }
    print("HELLO " + json.dumps(summary))
    want_nodes = int(os.environ.get("RAYSTACK_EXPECT_NODES", "0"))
    want_gpus = float(os.environ.get("RAYSTACK_EXPECT_GPUS", "0"))
    if len(nodes) < want_nodes or summary["gpus"] < want_gpus:
        print(f"expected {want_nodes} nodes and {want_gpus} GPUs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
