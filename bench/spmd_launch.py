"""Benchmark: what launching an SPMD job through raystack costs, against srun + torchrun.

On one warm 4-node testbed cluster (2 GPUs a node), in the same run, alternating (--repeats
times each):
  raystack  `kind: spmd` torchrun job (4 nodes x 2 processes, jobs/debug/spmd.py) submitted to
            the queue: the queue runner, the Ray job, each node's launch host (launch/pool.py),
            torchrun.
  srun      the same torchrun started directly inside the same allocation, the way a
            hand-written sbatch script does: `srun --jobid J --overlap --nodes 4 torchrun ...`.
  srun+ray  srun again, with a trivial job submitted through Ray's SDK at the same moment: Ray's
            job start (its supervisor, its driver) on the cores the ranks start on, as for a job
            through raystack.
  ray job   Ray's own floor on the same cluster: Ray's SDK submits `python -c` printing one line
            (queue_gap.floor): what every job through the Ray Jobs API pays before its entrypoint
            runs (the job supervisor's worker, the driver's python), raystack or not.
Then, on a second cluster started with RAYSTACK_SPMD_POOL=0 (--no-actors leaves it out):
  actors    the same job with a new launcher actor per node (as before the launch hosts), and
            srun again beside it (the ratio of that pair).
Measured: submit (or srun start) -> the last rank's first line (each rank stamps the time it
reported itself, after its process group is up and an all-reduce is done). Target: raystack
within 1.1x of srun (medians; issue 43, 1.5x before). Also reported: raystack less Ray's floor
against srun, the share of the launch that is raystack's and the launchers', and the CPU each
role used in that window in each arm (bench/cpu_roles.py: the ranks, torchrun, Ray's job
supervisor and its other processes, raystack's driver, launch hosts, queue runner and node
programs): on the testbed every node shares 2 cores, so the launch is as long as that work.

    python bench/spmd_launch.py [--repeats 3] [--no-actors]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import on_testbed, publish  # noqa: E402
from cpu_roles import Sampler, table  # noqa: E402
from queue_gap import FIRST, floor, sdk_first_line, up  # noqa: E402

from raystack import Cluster  # noqa: E402
from raystack.spec.job import JobSpec  # noqa: E402
from raystack.store.ledger import JobState  # noqa: E402

NODES, PROCS = 4, 2
TARGET = 1.1  # (issue 43; 1.5 before)
COMMAND = "spmd.py --steps 1"
PARTS = ("started", "import", "meet")  # (first_lines)
RUN_ROWS = (("raystack", "raystack"), ("srun", "srun"), ("srun+ray", "srun_ray"), ("ray job", "floor"))
RUN_ARMS = {key: name for name, key in RUN_ROWS}
RANKS = (("-u spmd.py", "ranks"),)  # (torchrun's command for a rank; the driver's names spmd.py too)


def first_lines(text: str, t0: float, parts: dict[str, list] | None = None) -> float:
    """Submit -> the last rank's first line (the time each rank stamped on its SPMD_RANK line);
    into `parts`, where the time went: the last rank's python running, each rank's import of
    torch (median), and the rendezvous and first all-reduce after the last import."""
    ranks = {}
    for line in text.splitlines():
        _, tag, data = line.partition("SPMD_RANK ")
        if tag:
            info = json.loads(data)
            ranks[info["rank"]] = info
    assert len(ranks) == NODES * PROCS, f"{len(ranks)} of {NODES * PROCS} ranks reported"
    got = list(ranks.values())
    last = max(r["t"] for r in got)
    if parts is not None:
        parts["started"].append(max(r["t_begun"] for r in got) - t0)
        parts["import"].append(statistics.median(r["t_imported"] - r["t_begun"] for r in got))
        parts["meet"].append(last - max(r["t_imported"] for r in got))
    return last - t0


def through_raystack(
    cluster: Cluster, i: int, how: list[str] | None = None, parts: dict[str, list] | None = None
) -> float:
    t0 = time.time()
    job = cluster.submit(
        JobSpec.model_validate(
            {
                "name": f"launch{i}",
                "kind": "spmd",
                "launcher": "torchrun",
                "nodes": NODES,
                "procs_per_node": PROCS,
                "command": COMMAND,
                "working_dir": str(REPO / "jobs" / "debug"),
            }
        )
    )
    # (a wait that asks every second: on the testbed this client shares the nodes' 2 cores, where
    # on a real cluster it runs on a login node; srun's own wait costs nothing either)
    record = job.wait(timeout=600, poll=1.0)
    assert record.state is JobState.SUCCEEDED, record.message
    logs = job.logs()
    if how is not None:  # (which launchers, as the driver says)
        how.append("launch hosts" if "on the cluster's launch hosts" in logs else "new launcher actors")
    return first_lines(logs, t0, parts)


def through_srun(
    cluster: Cluster, i: int, parts: dict[str, list] | None = None, beside: bool = False
) -> float:
    """`beside`: a trivial job submitted through Ray's SDK at the same moment (Ray's job start,
    its supervisor and driver, on the cores the ranks start on, as in a job through raystack)."""
    record = cluster.record()
    bindir = Path(sys.executable).parent
    inner = (
        f"cd {REPO / 'jobs' / 'debug'} && exec {bindir}/torchrun --nnodes={NODES} "
        f"--node_rank=$SLURM_NODEID --nproc_per_node={PROCS} --master_addr={record.head_ip} "
        f"--master_port={29600 + i} {COMMAND}"
    )
    ray_job = None
    if beside:  # (its status asked every second, as the raystack arm's client asks)
        trivial = (cluster.dashboard().jobs, f'python -c "{FIRST}"', 1.0)
        ray_job = threading.Thread(target=sdk_first_line, args=trivial)
    t0 = time.time()
    if ray_job is not None:
        ray_job.start()
    proc = subprocess.run(
        ["srun", f"--jobid={record.allocation_id}", "--overlap", f"--nodes={NODES}", f"--ntasks={NODES}",
         "--ntasks-per-node=1", "bash", "-c", inner],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if ray_job is not None:
        ray_job.join()
    assert proc.returncode == 0, proc.stderr[-2000:]
    return first_lines(proc.stdout + proc.stderr, t0, parts)


def arms(cluster: Cluster, repeats: int, floor_too: bool) -> dict[str, Any]:
    """raystack and srun alternating on one cluster (and Ray's floor): the seconds of each run."""
    out: dict[str, Any] = {"raystack": [], "srun": [], "srun_ray": [], "floor": [], "how": []}
    out["parts"] = {arm: {k: [] for k in PARTS} for arm in ("raystack", "srun")}
    out["cpu"] = {arm: [] for arm in ("raystack", "srun", "srun_ray")}
    through_raystack(cluster, -1)  # warm-up: the working_dir package, torch's first import
    through_srun(cluster, 99)

    def timed(arm: str, run: Any, *args: Any, **kw: Any) -> None:  # (and each role's CPU meanwhile)
        t0 = time.time()
        seconds = run(*args, **kw)
        out[arm].append(seconds)
        out["cpu"][arm].append(cpu.window(t0, t0 + seconds))

    with Sampler(extra=RANKS) as cpu:
        for i in range(repeats):
            timed("raystack", through_raystack, cluster, i, out["how"], out["parts"]["raystack"])
            timed("srun", through_srun, cluster, i, out["parts"]["srun"])
            if floor_too:
                timed("srun_ray", through_srun, cluster, 50 + i, beside=True)
                out["floor"] += floor(cluster, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-actors", action="store_true", help="leave out the launcher-actor cluster")
    args = parser.parse_args()
    on_testbed("bench-spmd-", NODES)
    runs = {}
    for name, env in (
        ("spmdbench", {}),
        *([] if args.no_actors else [("spmdactors", {"RAYSTACK_SPMD_POOL": "0"})]),
    ):
        cluster = up(name, False, env, gpus_per_node=PROCS)  # (the job takes whole nodes)
        try:
            runs[name] = arms(cluster, args.repeats, floor_too=not env)
        finally:
            cluster.down()
    pooled = runs["spmdbench"]
    ray_m, srun_m, floor_m = (statistics.median(pooled[k]) for k in ("raystack", "srun", "floor"))
    ratio, ours = ray_m / srun_m, (ray_m - floor_m) / srun_m
    rows = [(name, pooled[k]) for name, k in RUN_ROWS]
    beside = ray_m / statistics.median(pooled["srun_ray"])
    actors = runs.get("spmdactors")
    if actors:
        rows += [("actors", actors["raystack"]), ("srun", actors["srun"])]
    lines = [
        f"{'launch':>10} {'median s':>9} {'runs s':>30}",
        *(
            f"{name:>10} {statistics.median(x):>9.2f} {' '.join(f'{v:.2f}' for v in x):>30}"
            for name, x in rows
        ),
        f"submit -> every rank's first line, {NODES} nodes x {PROCS} processes: "
        f"raystack / srun = {ratio:.2f}x (target <= {TARGET}x); less Ray's job floor "
        f"(submit -> a trivial entrypoint's first line): {ours:.2f}x; launchers: {sorted(set(pooled['how']))}",
    ]
    parts = {
        arm: {k: round(statistics.median(v), 2) for k, v in p.items()} for arm, p in pooled["parts"].items()
    }
    lines.append(
        "where it went, medians (s): "
        + "; ".join(
            f"{arm}: last rank's python running {p['started']:.2f}, import torch {p['import']:.2f}, "
            f"rendezvous + all-reduce after the last import {p['meet']:.2f}"
            for arm, p in parts.items()
        )
    )
    cpu = {arm: runs for arm, runs in pooled["cpu"].items() if runs}
    lines.append(
        "CPU each role used from the submit to the last rank's first line (all nodes share the cores):"
    )
    lines += table({RUN_ARMS[a]: v for a, v in cpu.items()}, {RUN_ARMS[a]: pooled[a] for a in cpu})
    if actors:
        a_ratio = statistics.median(actors["raystack"]) / statistics.median(actors["srun"])
        lines.append(f"with new launcher actors (RAYSTACK_SPMD_POOL=0): {a_ratio:.2f}x srun in that cluster")
    publish(
        "spmd_launch",
        "\n".join(lines),
        {
            "nodes": NODES,
            "procs_per_node": PROCS,
            "raystack_s": [round(x, 3) for x in pooled["raystack"]],
            "srun_s": [round(x, 3) for x in pooled["srun"]],
            "ray_job_floor_s": [round(x, 3) for x in pooled["floor"]],
            "srun_beside_ray_job_s": [round(x, 3) for x in pooled["srun_ray"]],
            "ratio_to_srun_beside_ray_job": round(beside, 3),
            "launchers": sorted(set(pooled["how"])),
            "parts_s": parts,
            "cpu_s": cpu,
            "ratio": round(ratio, 3),
            "ratio_less_ray_floor": round(ours, 3),
            "target_within": ratio <= TARGET,
            **(
                {
                    "actors_s": [round(x, 3) for x in actors["raystack"]],
                    "actors_srun_s": [round(x, 3) for x in actors["srun"]],
                    "actors_ratio": round(a_ratio, 3),
                }
                if actors
                else {}
            ),
        },
    )


if __name__ == "__main__":
    main()
