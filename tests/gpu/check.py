"""Run by tests/gpu/run.sh on a GPU machine: the queue on real GPUs, and what the jobs report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from raystack import Cluster
from raystack.allocation.rayproc import gpu_processes
from raystack.store import cluster as clusters
from raystack.store.ledger import JobState

DEBUG = Path(__file__).resolve().parents[2] / "jobs" / "debug"


def marker(text: str, prefix: str) -> dict:
    return json.loads(next(ln for ln in text.splitlines() if ln.startswith(prefix + " "))[len(prefix) + 1 :])


def main() -> int:
    ngpu = int(sys.argv[1])
    t0 = time.time()
    cluster = Cluster("gpu")
    while not clusters.exists("gpu"):
        time.sleep(0.2)
    cluster.wait_ready(timeout=300)
    print(f"READY after {time.time() - t0:.1f}s: {cluster.status().to_dict()}")
    jobs = [
        cluster.submit(DEBUG / "hello.yaml"),
        cluster.submit(
            DEBUG / "allreduce.yaml", sets=["entrypoint=python allreduce.py --size-mb 1024 --iters 20"]
        ),
        cluster.submit(
            DEBUG / "zero3.yaml",
            sets=[f"entrypoint=python zero3.py --steps 5 --hidden 1024 --learners {ngpu} --strategy PACK"],
        ),
    ]
    ok = True
    for job in jobs:
        record = job.wait(timeout=900)
        took = (record.ended or 0) - (record.started or 0)
        print(f"{job.id}: {record.state.value} in {took:.1f}s ({record.message})")
        if record.state is not JobState.SUCCEEDED:
            ok = False
            print(job.logs()[-4000:])
    logs = {j.id.rsplit("-", 1)[0]: j.logs() for j in jobs}
    checks = {}
    if "ALLREDUCE " in logs["allreduce"]:
        ar = marker(logs["allreduce"], "ALLREDUCE")
        print("ALLREDUCE", ar)
        checks["allreduce nccl over every GPU"] = (
            ar["backend"] == "nccl" and ar["world"] == ngpu and ar["all_ok"]
        )
    if "ZERO3 " in logs["zero3"]:
        z3 = marker(logs["zero3"], "ZERO3")
        print("ZERO3", z3)
        checks["zero3 loss down and sharded"] = z3["loss_went_down"] and z3["sharded"]
    if "HELLO " in logs["hello"]:
        checks["hello sees every GPU"] = marker(logs["hello"], "HELLO")["gpus"] == ngpu
    entry = clusters.read_node_entries("gpu")
    print("node entries:", entry)
    checks["node reports GPU use"] = all(time.time() - e.get("gpu_checked", 0) < 10 for e in entry.values())
    # The leftover-GPU-memory check: a descendant holding GPU memory must be seen.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import torch, time; x = torch.ones(2**28, device='cuda'); "
            "print('holding', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    held = gpu_processes()
    print("gpu_processes() while a child holds 1 GiB:", held)
    checks["gpu_processes sees a leftover"] = any(pid == holder.pid and mib >= 1000 for pid, mib in held)
    holder.kill()
    holder.wait()
    print("CHECKS", json.dumps(checks))
    return 0 if ok and checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
