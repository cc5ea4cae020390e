"""Benchmark: time from the allocation becoming RUNNING to a usable Ray cluster, N = 1, 2, 4, 8.

Three ways to start Ray in the same SLURM allocation shape, measured in the same run:
  raystack  `raystack up` (raystack.allocation.node): free ports, token auth, READY = all nodes + GPUs +
            CPUs registered and the Jobs API answering an authenticated request.
  floor     bare `ray start --head` and every worker started at once (one srun), no checks.
  ray-docs  the pattern of Ray's SLURM documentation: head, `sleep 10`, then the workers one by
            one with `sleep 5` between them.
RUNNING is observed by polling squeue from the login node (every 50 ms); the floor and ray-docs
are "ready" when the State API on the head reports N alive nodes (polled every 100 ms). raystack
is ready when its record says READY (a stricter condition: it also checks GPUs, CPUs and Jobs).

    python bench/cluster_ready.py [--nodes 1 2 4 8] [--repeat 2]

Prints a table and one JSON line; writes bench/results/cluster_ready.{json,txt}.
Needs root and the testbed with max(--nodes) nodes (started here if needed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import publish  # noqa: E402

from raystack import Cluster  # noqa: E402
from raystack.adapters import slurm  # noqa: E402
from raystack.adapters.ray import Dashboard  # noqa: E402
from raystack.errors import RayApiError  # noqa: E402
from raystack.store import cluster as clusters  # noqa: E402

HOME = Path(os.environ.get("RAYSTACK_TESTBED_DIR", "/var/lib/raystack-testbed")) / "home"
TARGET = 1.5  # raystack within 1.5x of the floor

BASE = r"""#!/bin/bash
set -u
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
export PATH={bindir}:$PATH
# Testbed nodes share /tmp: each Ray node needs its own temp dir (raystack uses rs-<job>-<host>).
# $(hostname) is expanded by the bash -c on each node, not here.
OPTS='--num-cpus=4 --num-gpus=4 --object-store-memory=268435456 --disable-usage-stats --block'
OPTS="$OPTS --temp-dir=/tmp/rb-$SLURM_JOB_ID-"'$(hostname)'
head_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
head_ip=$(getent hosts "$head_host" | awk '{{print $1}}')
srun --overlap --nodes=1 --ntasks=1 -w "$head_host" bash -c \
  "ray start --head --node-ip-address=$head_ip --port=6379 --dashboard-host=$head_ip --dashboard-port=8265 $OPTS" &
"""
FLOOR = (
    BASE
    + r"""
if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then
  # NOTE: srun inherits SLURM_NTASKS from the batch step: give the task count explicitly.
  srun --overlap --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks=$((SLURM_JOB_NUM_NODES - 1)) \
    --ntasks-per-node=1 --exclude="$head_host" bash -c \
    "ray start --address=$head_ip:6379 --node-ip-address=\$(getent hosts \$(hostname) | awk '{{print \$1}}') $OPTS" &
fi
wait
"""
)
RAY_DOCS = (
    BASE
    + r"""
sleep 10
for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n +2); do
  srun --overlap --nodes=1 --ntasks=1 -w "$node" bash -c \
    "ray start --address=$head_ip:6379 --node-ip-address=\$(getent hosts \$(hostname) | awk '{{print \$1}}') $OPTS" &
  sleep 5
done
wait
"""
)


def wait_running(job: str) -> float:
    """Epoch time at which squeue first shows the job RUNNING (50 ms polling)."""
    while True:
        info = slurm.squeue([job]).get(job)
        if info and info.state is slurm.SlurmState.RUNNING:
            return time.time()
        if info and info.state.is_terminal():
            raise RuntimeError(f"job {job} ended before running: {info.state}")
        time.sleep(0.05)


def wait_alive(url: str, nodes: int, timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if len(Dashboard(url, token="").alive_nodes(timeout=2)) >= nodes:
                return time.time()
        except RayApiError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{nodes} nodes not alive at {url} within {timeout}s")


def testbed_ip(host: str) -> str:
    hosts = (HOME.parent / "etc" / "hosts").read_text().split("\n")
    return next(line.split()[0] for line in hosts if line.split()[1:] == [host])


def end_job(job: str) -> None:
    slurm.scancel(job)
    while (info := slurm.job_info(job)) and not info.state.is_terminal():
        time.sleep(0.2)


def run_baseline(kind: str, nodes: int, workdir: Path) -> float:
    script = workdir / f"{kind}.sbatch"
    template = FLOOR if kind == "floor" else RAY_DOCS
    script.write_text(template.format(bindir=Path(sys.executable).parent))
    job = slurm.sbatch(
        [
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            "--cpus-per-task=4",
            "--gpus-per-node=4",
            "--partition=testbed",
            f"--output={workdir}/{kind}-%j.log",
        ],
        str(script),
    )
    try:
        running = wait_running(job)
        head = slurm.hostnames(slurm.squeue([job])[job].nodes)[0]
        ip = testbed_ip(head)
        return wait_alive(f"http://{ip}:8265", nodes) - running
    finally:
        end_job(job)


def run_raystack(nodes: int, name: str) -> float:
    cluster = Cluster.up(nodes, profile="testbed", name=name, wait=False)
    job = str(cluster.record().slurm_job_id)
    try:
        running = wait_running(job)
        cluster.wait_ready(timeout=300)
        ready = next(h["time"] for h in clusters.read(name).history if h["state"] == "READY")
        return ready - running
    finally:
        cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    subprocess.run(
        [str(REPO / "slurm/testbed/up"), "--nodes", str(max(args.nodes))],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    HOME.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-", dir=HOME))
    os.environ["RAYSTACK_HOME"] = str(workdir / "rs")
    samples: dict[tuple[int, str], list[float]] = {}
    for rep in range(args.repeat):
        for n in args.nodes:
            for kind in ("floor", "raystack", "ray-docs"):
                t = (
                    run_raystack(n, f"bench-{n}-{rep}")
                    if kind == "raystack"
                    else run_baseline(kind, n, workdir)
                )
                samples.setdefault((n, kind), []).append(t)
                print(f"  rep {rep} N={n} {kind:9s} {t:6.2f}s", file=sys.stderr, flush=True)
    report(args.nodes, samples)


def report(node_counts: list[int], samples: dict[tuple[int, str], list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = []
    for n in node_counts:
        ratio = med[(n, "raystack")] / med[(n, "floor")]
        rows.append(
            {
                "nodes": n,
                "floor_s": round(med[(n, "floor")], 2),
                "raystack_s": round(med[(n, "raystack")], 2),
                "ray_docs_s": round(med[(n, "ray-docs")], 2),
                "raystack_over_floor": round(ratio, 2),
                "within_target": ratio <= TARGET,
            }
        )
    lines = [f"{'N':>3} {'floor s':>8} {'raystack s':>10} {'ray-docs s':>10} {'raystack/floor':>14}"]
    lines += [
        f"{r['nodes']:>3} {r['floor_s']:>8.2f} {r['raystack_s']:>10.2f} {r['ray_docs_s']:>10.2f} "
        f"{r['raystack_over_floor']:>13.2f}{'' if r['within_target'] else ' !'}"
        for r in rows
    ]
    result = {
        "target": f"raystack <= {TARGET}x floor",
        "samples": {f"{n}/{k}": [round(x, 2) for x in v] for (n, k), v in samples.items()},
        "rows": rows,
    }
    publish("cluster_ready", "\n".join(lines), result)


if __name__ == "__main__":
    main()
