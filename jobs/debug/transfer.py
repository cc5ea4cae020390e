"""Debug job: move objects from one node's object store to another's and time it: the cluster
network through Ray's object manager (with `tls: true`, its encryption too).

    python transfer.py [--mib 1024] [--chunk-mib 256] [--repeats 3]

Prints one line `TRANSFER {json}`: seconds per repeat for the remote gets (objects made on node
A, read by a task on node B) and for the same reads on node A itself (no transfer: the
scheduling cost, to subtract), and the transfer rate from their difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
def make(mib: int) -> np.ndarray:
    return np.ones(mib << 20, dtype=np.uint8)


@ray.remote(num_cpus=0)
def nbytes(array: np.ndarray) -> int:
    return int(array.nbytes)


def on(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def timed_reads(src: str, dst: str, mib: int, chunk: int) -> float:
    """Seconds spent reading `mib` MiB made on `src` from a task on `dst`, chunk by chunk."""
    spent = 0.0
    for _ in range(mib // chunk):
        ref = make.options(scheduling_strategy=on(src)).remote(chunk)
        ray.wait([ref], fetch_local=False)
        t0 = time.perf_counter()
        assert ray.get(nbytes.options(scheduling_strategy=on(dst)).remote(ref)) == chunk << 20
        spent += time.perf_counter() - t0
        del ref
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ray.init()
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    if len(nodes) < 2:
        raise SystemExit("transfer.py: needs a cluster of at least 2 nodes")
    a, b = nodes[0], nodes[1]
    timed_reads(a, b, args.chunk_mib, args.chunk_mib)  # warm-up: workers on both nodes
    remote = [timed_reads(a, b, args.mib, args.chunk_mib) for _ in range(args.repeats)]
    local = [timed_reads(a, a, args.mib, args.chunk_mib) for _ in range(args.repeats)]
    moved = statistics.median(remote) - statistics.median(local)
    result = {
        "mib": args.mib,
        "chunk_mib": args.chunk_mib,
        "remote_s": [round(x, 3) for x in remote],
        "local_s": [round(x, 3) for x in local],
        "gib_per_s": round(args.mib / 1024 / moved, 3) if moved > 0 else None,
    }
    print("TRANSFER " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
