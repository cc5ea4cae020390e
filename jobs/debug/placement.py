"""placement: an open-instruct-shaped job: learner bundles (STRICT_SPREAD, one per node) and vLLM
engine bundles (PACK), with the driver's environment forwarded to every actor as open-instruct's
grpo_fast.py does (`ray.init(runtime_env={"env_vars": dict(os.environ)})`, minus
CUDA_VISIBLE_DEVICES).

Every actor reports the GPUs Ray gave it and what CUDA_VISIBLE_DEVICES it sees; the job fails
unless each actor sees exactly its own GPUs and no two actors on a node share one (when they do,
every learner lands on physical GPU 0: the bug that forwarding RAY_EXPERIMENTAL_NOSET_* causes).
On real GPUs each actor also checks that torch sees exactly that many devices.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections import defaultdict

import ray
from gpudriver import gpu_driver_here
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote
class Probe:
    def __init__(self, role: str):
        self.role = role

    def report(self) -> dict:
        torch_sees = None
        if gpu_driver_here():
            try:
                import torch

                torch_sees = torch.cuda.device_count() if torch.cuda.is_available() else None
            except ImportError:
                pass
        return {
            "role": self.role,
            "host": socket.gethostname(),
            "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "noset_forwarded": "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES" in os.environ,
            "torch_sees": torch_sees,
        }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--learners-per-node", type=int, default=1, help="GPUs in each learner bundle")
    parser.add_argument("--learner-nodes", type=int, default=0, help="default: every node")
    parser.add_argument("--engines", type=int, default=0, help="default: the GPUs left over")
    args = parser.parse_args()
    driver_cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    forwarded = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    ray.init(runtime_env={"env_vars": forwarded})  # what open-instruct and NeMo-RL do
    nodes = [n for n in ray.nodes() if n["Alive"]]
    gpus = int(ray.cluster_resources().get("GPU", 0))
    per_node = int(nodes[0]["Resources"].get("GPU", 0))
    learner_nodes = args.learner_nodes or len(nodes)
    n = args.learners_per_node
    engines = args.engines or max(0, gpus - n * learner_nodes)
    learner_pg = placement_group([{"GPU": n, "CPU": n}] * learner_nodes, strategy="STRICT_SPREAD")
    ray.get(learner_pg.ready(), timeout=300)
    probes = [
        Probe.options(
            num_gpus=n,
            num_cpus=n,
            scheduling_strategy=PlacementGroupSchedulingStrategy(learner_pg, placement_group_bundle_index=i),
        ).remote("learner")
        for i in range(learner_nodes)
    ]
    if engines:
        engine_pg = placement_group([{"GPU": 1, "CPU": 1}] * engines, strategy="PACK")
        ray.get(engine_pg.ready(), timeout=300)
        probes += [
            Probe.options(
                num_gpus=1,
                num_cpus=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    engine_pg, placement_group_bundle_index=i
                ),
            ).remote("engine")
            for i in range(engines)
        ]
    reports = ray.get([p.report.remote() for p in probes], timeout=300)
    problems = []
    taken: dict[str, list[str]] = defaultdict(list)
    for r in reports:
        seen = [d for d in r["cuda_visible_devices"].split(",") if d]
        if seen != r["ray_gpu_ids"]:
            problems.append(f"{r['role']} on {r['host']} was given GPUs {r['ray_gpu_ids']} but sees {seen}")
        if r["noset_forwarded"]:
            problems.append(f"{r['role']} on {r['host']} got RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")
        if r["torch_sees"] is not None and r["torch_sees"] != len(r["ray_gpu_ids"]):
            problems.append(f"{r['role']} on {r['host']}: torch sees {r['torch_sees']} GPUs")
        taken[r["host"]] += seen
    for host, ids in taken.items():
        if len(ids) != len(set(ids)):
            problems.append(f"GPUs shared on {host}: {sorted(ids)}")
    summary = {
        "nodes": len(nodes),
        "gpus_per_node": per_node,
        "learners": learner_nodes * n,
        "engines": engines,
        "driver_cuda_visible_devices": driver_cvd,
        "driver_noset": os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"),
        "actors": reports,
        "problems": problems,
        "ok": not problems,
    }
    for r in reports:
        cvd = r["cuda_visible_devices"]
        print(f"{r['role']:8s} {r['host']}: Ray GPUs {r['ray_gpu_ids']}, CUDA_VISIBLE_DEVICES={cvd}")
    print("PLACEMENT " + json.dumps(summary))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
