"""spread: where a job's actors land. Creates N actors asking G GPUs each (and, with --pg, a
placement group of N bundles that they go into), has each report its node and the GPUs Ray gave
it, holds them --hold seconds (so jobs side by side overlap), and prints one line:

    SPREAD {"nodes": [...], "actors": [{"node": ..., "ip": ..., "gpus": [...]}, ...], "start": t0, "end": t1}

A packed job (needs: {nodes: K}) must find every actor on its own K nodes (RAYSTACK_NODES).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote
class Where:
    def report(self) -> dict:
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--gpus", type=float, default=1)
    parser.add_argument("--pg", action="store_true", help="the actors in a placement group (SPREAD)")
    parser.add_argument("--hold", type=float, default=0)
    parser.add_argument("--fail-if", default="", help="exit 3 when this env var is set to 'yes'")
    args = parser.parse_args()
    start = time.time()
    ray.init()
    options: dict = {"num_gpus": args.gpus, "num_cpus": 0.1}
    if args.pg:
        pg = placement_group([{"GPU": args.gpus, "CPU": 0.1}] * args.actors, strategy="SPREAD")
        ray.get(pg.ready(), timeout=120)
    actors = []
    for i in range(args.actors):
        opts = dict(options)
        if args.pg:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
        actors.append(Where.options(**opts).remote())
    found = ray.get([a.report.remote() for a in actors], timeout=300)
    time.sleep(args.hold)
    line = {
        "nodes": os.environ.get("RAYSTACK_NODES", ""),
        "actors": found,
        "start": start,
        "end": time.time(),
    }
    print("SPREAD " + json.dumps(line), flush=True)
    return 3 if args.fail_if and os.environ.get(args.fail_if) == "yes" else 0


if __name__ == "__main__":
    raise SystemExit(main())
