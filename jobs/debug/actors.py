"""actors: the init burst of a GRPO job — several hundred actors created at once on every node.

`python actors.py --actors 300` creates that many small actors (no CPU or GPU reserved, as
open-instruct's and verl's helper actors), round robin over every alive node, all at once, then
waits until every one has answered a ping. Prints one JSON line: actors per node, seconds from
the first creation call to all alive, and the errors of any actor that did not come up (a worker
that missed its registration timeout shows here). Exit code 1 unless all came up.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0, max_restarts=0)
class Helper:
    def __init__(self, index: int):
        self.index = index

    def ping(self) -> tuple[int, str, int]:
        return self.index, socket.gethostname(), os.getpid()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--actors", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for all of them")
    args = parser.parse_args()
    ray.init()
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    t0 = time.time()
    on = [NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=False) for i in range(args.actors)]
    helpers = [Helper.options(scheduling_strategy=on[i]).remote(i) for i in range(args.actors)]
    created = time.time() - t0
    per_host: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    pending = {h.ping.remote(): i for i, h in enumerate(helpers)}
    deadline = time.time() + args.timeout
    while pending and time.time() < deadline:
        done, _ = ray.wait(list(pending), num_returns=min(len(pending), 50), timeout=5)
        for ref in done:
            index = pending.pop(ref)
            try:
                _, host, _pid = ray.get(ref)
                per_host[host] += 1
            except Exception as exc:  # an actor that died: say which and why, go on with the rest
                errors.append(f"actor {index}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    alive_s = time.time() - t0
    errors += [f"actor {i}: not alive after {args.timeout:.0f}s" for i in pending.values()]
    all_alive_at = time.time()
    print(
        json.dumps(
            {
                "actors": args.actors,
                "nodes": len(nodes),
                "alive": sum(per_host.values()),
                "per_host": dict(sorted(per_host.items())),
                "create_calls_s": round(created, 2),
                "all_alive_s": round(alive_s, 2),
                "all_alive_at": round(all_alive_at, 3),
                "errors": errors[:20],
                "error_count": len(errors),
            }
        ),
        flush=True,
    )
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
