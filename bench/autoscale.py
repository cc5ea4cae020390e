"""Benchmark: a cluster that grows for its queue (`up -N 1 --max-nodes 4`) against fixed ones.

In the same run, on the testbed, the same queue of N one-node jobs of J seconds each
(`needs: {nodes: 1}`) on three clusters, one after another:
  fixed-1   `up -N 1`: the jobs run one after another on the one node.
  fixed-4   `up -N 4`: they run side by side, the 4 nodes held from `up` to the queue's end.
  auto      `up -N 1 --max-nodes 4 --idle-timeout I`: the queue grows the cluster (a further
            allocation of the missing nodes), which shrinks back once its nodes idle for I.
Reported per arm: makespan (the first submit -> the last job's end) and node-hours, counted from
SLURM's own start and end times of every allocation the arm held until its queue was done and
grown nodes released (the head's allocation until the last job's end, as a user would `down`).

`--scenario uneven` (issue 66's queue, scaled): a 1-node debug job, a 4-node GRPO-shaped job
(`needs.nodes: 4`), then eight 1-node evaluations, all queued at once, on the fixed 4-node
cluster and the one that grows from 1 (the fixed 1-node cluster cannot hold the 4-node job).

    python bench/autoscale.py [--jobs 3] [--seconds 60] [--idle 30]
    python bench/autoscale.py --scenario uneven [--seconds 60] [--idle 30]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import on_testbed, publish  # noqa: E402

from raystack import Cluster  # noqa: E402
from raystack.adapters import slurm  # noqa: E402
from raystack.store import cluster as records  # noqa: E402
from raystack.store.ledger import JobState  # noqa: E402


def raystack(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "raystack.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"raystack {' '.join(args)}: {done.stderr.strip()}")


def held(alloc: str, until: float) -> float:
    """Node-seconds SLURM gave an allocation, from its start to its end (or `until`)."""
    info = slurm.job_info(alloc)
    assert info is not None, alloc
    start, end = info.start_time, info.end_time if info.state.is_terminal() else until
    nodes = info.node_count or len(slurm.hostnames(info.nodes)) if info.nodes else 1
    return max(0.0, min(end or until, until) - start) * nodes if start else 0.0


def queue(scenario: str, jobs: int, seconds: int) -> list[tuple[int, int]]:
    """(nodes, seconds) of each job, in the order they are queued."""
    if scenario == "uneven":  # (a debug job, a GRPO-shaped one on 4 nodes, eight evaluations)
        return [(1, seconds), (4, round(1.5 * seconds)), *[(1, seconds)] * 8]
    return [(1, seconds)] * jobs


def arm(name: str, nodes: int, work: list[tuple[int, int]], idle: int, max_nodes: int | None) -> dict:
    extra = ["--max-nodes", str(max_nodes), "--idle-timeout", f"{idle}s"] if max_nodes else []
    raystack("up", "-N", str(nodes), "--profile", "testbed", "--time", "30", "--name", name, *extra)
    cluster = Cluster(name)
    t0 = time.time()
    submitted = [
        cluster.submit(["python", "-c", f"import time; time.sleep({secs})"], sets=[f"needs.nodes={n}"])
        for n, secs in work
    ]
    done = [job.wait(timeout=sum(secs for _, secs in work) + 900) for job in submitted]
    assert all(r.state is JobState.SUCCEEDED for r in done), [r.message for r in done]
    end = max(r.ended or 0 for r in done)
    record = records.read(name)
    if max_nodes:  # (the grown nodes count until released: the cost of shrinking back)
        deadline = time.time() + idle + 300
        while any(not g.released for g in records.read(name).grown) and time.time() < deadline:
            time.sleep(2)
        record = records.read(name)
    grown_end = max([g.released or end for g in record.grown], default=end)
    node_s = held(str(record.allocation_id), end) + sum(held(g.alloc_id, grown_end) for g in record.grown)
    raystack("down", name)
    return {
        "arm": name,
        "makespan_s": round(end - t0, 1),
        "node_hours": round(node_s / 3600, 4),
        "grown": [{"alloc": g.alloc_id, "nodes": g.nodes} for g in record.grown],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--idle", type=int, default=30)
    parser.add_argument("--scenario", choices=("equal", "uneven"), default="equal")
    args = parser.parse_args()
    on_testbed("bench-auto-")
    work = queue(args.scenario, args.jobs, args.seconds)
    rows = [
        *([arm("fixed-1", 1, work, args.idle, None)] if args.scenario == "equal" else []),
        arm("fixed-4", 4, work, args.idle, None),
        arm("auto", 1, work, args.idle, 4),
    ]
    what = (
        f"{args.jobs} one-node jobs of {args.seconds}s"
        if args.scenario == "equal"
        else f"uneven: {', '.join(f'{n} node(s) x {secs}s' for n, secs in work[:3])}, ... ({len(work)} jobs)"
    )
    table = "\n".join(
        [
            f"{what}; auto: up -N 1 --max-nodes 4 --idle-timeout {args.idle}s",
            f"{'arm':10} {'makespan s':>11} {'node-hours':>11}",
            *(f"{r['arm']:10} {r['makespan_s']:>11} {r['node_hours']:>11}" for r in rows),
        ]
    )
    by = {r["arm"]: r for r in rows}
    ratios = {
        "auto_node_hours_vs_fixed4": round(by["auto"]["node_hours"] / by["fixed-4"]["node_hours"], 3),
        "auto_makespan_vs_fixed4": round(by["auto"]["makespan_s"] / by["fixed-4"]["makespan_s"], 3),
    }
    if "fixed-1" in by:
        ratios["auto_makespan_vs_fixed1"] = round(by["auto"]["makespan_s"] / by["fixed-1"]["makespan_s"], 3)
    name = "autoscale" if args.scenario == "equal" else "autoscale_uneven"
    publish(
        name,
        table + "\n" + "  ".join(f"{k}: {v}" for k, v in ratios.items()),
        {"scenario": args.scenario, "queue": work, "idle_timeout_s": args.idle, "rows": rows, **ratios},
    )


if __name__ == "__main__":
    main()
