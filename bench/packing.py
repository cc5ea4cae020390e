"""Jobs side by side: the makespan of 8 one-node jobs on a 4-node cluster, packed (each declares
`needs: {nodes: 1}`, so four run at once on nodes of their own) against one after another (the
same jobs declaring nothing), on one testbed cluster, alternating the two orders each round.

Each job is jobs/debug/spread.py: --actors GPU actors on its node, held --hold seconds (the
testbed's 2 cores start four jobs' drivers and actors at once slower than one: fewer actors and
a longer hold measure the scheduling rather than that). Makespan: from
the first submit to the last job's end (the ledger's times). Target: packed <= 0.3x.

    python bench/packing.py [--jobs 8] [--hold 45] [--actors 1] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import on_testbed, publish

from raystack import Cluster

DEBUG = Path(__file__).resolve().parents[1] / "jobs" / "debug"


def makespan(cluster: Cluster, jobs: int, hold: float, packed: bool, actors: int) -> dict:
    sets = [f"working_dir={DEBUG}", "name=pack" if packed else "name=seq"]
    if packed:
        sets.append("needs.nodes=1")
    t0 = time.time()
    handles = [
        cluster.submit(
            ["python", "spread.py", "--actors", str(actors), "--gpus", "1", "--hold", str(hold)], sets=sets
        )
        for _ in range(jobs)
    ]
    records = [h.wait(timeout=jobs * (hold + 120)) for h in handles]
    bad = [r.message for r in records if r.state.value != "SUCCEEDED"]
    if bad:
        raise SystemExit(f"a job did not succeed: {bad[0]}")
    end = max(r.ended or 0 for r in records)
    most = 0
    for r in records:  # the most jobs running at one time
        most = max(most, sum(1 for o in records if o.started <= r.started < o.ended))  # type: ignore[operator]
    run = statistics.median(r.ended - r.started for r in records)  # type: ignore[operator]
    return {"makespan_s": round(end - t0, 1), "max_at_once": most, "job_run_s": round(run, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--hold", type=float, default=45.0)
    parser.add_argument("--actors", type=int, default=1, help="GPU actors per job")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    on_testbed("packing-", nodes=4)
    cluster = Cluster.up(4, profile="testbed", name="packing", timeout=300)
    runs: dict[str, list[dict]] = {"one after another": [], "packed": []}
    try:
        for i in range(args.rounds):
            order = [False, True] if i % 2 == 0 else [True, False]
            for packed in order:
                row = makespan(cluster, args.jobs, args.hold, packed, args.actors)
                runs["packed" if packed else "one after another"].append(row)
                print(json.dumps({"packed": packed, **row}), flush=True)
    finally:
        cluster.down()
    med = {k: statistics.median(r["makespan_s"] for r in v) for k, v in runs.items()}
    ratio = med["packed"] / med["one after another"]
    lines = [
        f"{args.jobs} one-node jobs ({args.actors} GPU actor(s) each, held {args.hold:g}s) on 4 testbed nodes, {args.rounds} rounds"
    ]
    lines.append(
        f"{'mode':20} {'makespan (median)':>18} {'runs':>24} {'most at once':>13} {'one job runs':>13}"
    )
    for mode, rows in runs.items():
        spans = ", ".join(f"{r['makespan_s']:.1f}" for r in rows)
        each = statistics.median(r["job_run_s"] for r in rows)
        lines.append(
            f"{mode:20} {med[mode]:>17.1f}s {spans:>24} {max(r['max_at_once'] for r in rows):>13} {each:>12.1f}s"
        )
    lines.append(f"packed / one after another: {ratio:.2f}x (target <= 0.30x)")
    publish(
        "packing", "\n".join(lines), {"runs": runs, "median_s": med, "ratio": round(ratio, 3), "target": 0.3}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
