"""Benchmark: a later job's submit -> first line through raystack against Ray's SDK, interleaved.

On a warm `up --local` cluster (this machine's CPUs and GPUs; the GPU machine has no SLURM),
round after round, one job of each arm (the cluster's first two jobs are left out of the rounds):
  raystack    `Cluster.submit` of a job printing its start time (the queue, its runner, Ray)
  sdk         Ray's JobSubmissionClient, the same entrypoint, nothing else
  sdk_as_rs   the SDK replaying what the runner sent Ray for such a job (its entrypoint, with the
              runtime_env variables and metadata every job gets), the same each round
  sdk_unique  the same with RAYSTACK_JOB_ID unique to each job (as the runner's are): whether a
              runtime_env that differs from job to job costs Ray's start anything
Each arm's median and its ratio to the SDK's (issue 43: later jobs <= 1.0x); pair by pair too.
It separates what raystack sends (sdk_as_rs, sdk_unique) from what it does around a job
(raystack against sdk_as_rs).

With --clusters N it does that on N clusters one after another, and times each cluster's first
job (issue 43: <= 1.1x the warm SDK median): on every other cluster raystack's job goes first, on
the rest the SDK's, so what any first job pays (Ray's, not raystack's) shows beside ours. One
cluster's first job is one sample at this machine's whim; several clusters tell a cold start from it.

    python bench/start_ab.py [--rounds 8] [--clusters 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _report import publish  # noqa: E402
from queue_gap import FIRST, first_line, sdk_first_line  # noqa: E402

from raystack import Cluster  # noqa: E402

ARMS = ("raystack", "sdk", "sdk_as_rs", "sdk_unique")


def via_raystack(cluster: Cluster) -> float:
    t0 = time.time()
    job = cluster.submit(["python", "-c", FIRST], sets=["name=ab"])
    job.wait(timeout=300)
    return first_line(job) - t0


def sent(sdk: Any, cluster: Cluster) -> tuple[dict[str, Any], float]:
    """What the runner submitted to Ray for a raystack job, as submit_job's arguments, and that
    job's submit -> first line."""
    t0 = time.time()
    job = cluster.submit(["python", "-c", FIRST], sets=["name=ab"])
    job.wait(timeout=300)
    seconds = first_line(job) - t0
    info = sdk.get_job_info(job.record().attempts[-1].id)
    metadata = {k: v for k, v in (info.metadata or {}).items() if k != "job_submission_id"}
    return {"entrypoint": info.entrypoint, "runtime_env": info.runtime_env, "metadata": metadata}, seconds


def via_sdk(sdk: Any, arm: str, runner: dict[str, Any]) -> float:
    if arm == "sdk":
        return sdk_first_line(sdk, f'python -c "{FIRST}"')
    options = dict(runner)
    if arm == "sdk_unique":
        env = {**options["runtime_env"]["env_vars"], "RAYSTACK_JOB_ID": uuid.uuid4().hex}
        options["runtime_env"] = {**options["runtime_env"], "env_vars": env}
    return sdk_first_line(sdk, **options)


def one_cluster(index: int, rounds: int) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """A fresh cluster: its first job (raystack's on even `index`, the SDK's on odd), the next
    job of the other arm, then `rounds` interleaved rounds: the first job's figures, each arm's runs."""
    cluster = Cluster.up_local(name=f"ab{os.getpid()}x{index}", timeout=300)
    try:
        sdk = cluster.dashboard().jobs
        if index % 2 == 0:
            first_arm = "raystack"
            runner, first = sent(sdk, cluster)
            second = via_sdk(sdk, "sdk", runner)
        else:
            first_arm = "sdk"
            first = via_sdk(sdk, "sdk", {})
            runner, second = sent(sdk, cluster)
        mine: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(rounds):
            for arm in ARMS:
                mine[arm].append(via_raystack(cluster) if arm == "raystack" else via_sdk(sdk, arm, runner))
    finally:
        cluster.down()
    warm = statistics.median(mine["sdk"])
    first_job = {
        "first_arm": first_arm,
        "first_s": round(first, 3),
        "second_s": round(second, 3),
        "warm_sdk_s": round(warm, 3),
        "first_over_warm_sdk": round(first / warm, 3),
        "first_over_own_later": round(first / statistics.median(mine[first_arm]), 3),
    }
    return first_job, mine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds on each cluster")
    parser.add_argument("--clusters", type=int, default=1, help="fresh clusters, one after another")
    args = parser.parse_args()
    results = [one_cluster(i, args.rounds) for i in range(args.clusters)]
    firsts = [first for first, _ in results]
    runs = {arm: [x for _, mine in results for x in mine[arm]] for arm in ARMS}
    med = {arm: statistics.median(v) for arm, v in runs.items()}
    ratio = {arm: round(med[arm] / med["sdk"], 3) for arm in ARMS}
    pairs = [round(a / b, 2) for a, b in zip(runs["raystack"], runs["sdk"], strict=True)]
    lines = [f"{'arm':12} {'median s':>9} {'/ sdk':>7}  runs"]
    lines += [
        f"{arm:12} {med[arm]:>9.3f} {ratio[arm]:>7.3f}  {' '.join(f'{x:.2f}' for x in runs[arm])}"
        for arm in ARMS
    ]
    lines.append(
        f"raystack / sdk pair by pair: {pairs}; {args.rounds} rounds interleaved on each of "
        f"{args.clusters} warm local cluster(s)"
    )
    lines.append("each cluster's first job (submit -> first line, s) over that cluster's warm SDK median:")
    lines += [
        f"  {f['first_arm']:9} first {f['first_s']:.2f} (next job {f['second_s']:.2f}), warm SDK "
        f"{f['warm_sdk_s']:.2f}: {f['first_over_warm_sdk']:.3f}x; over its own arm's later jobs "
        f"{f['first_over_own_later']:.3f}x"
        for f in firsts
    ]
    by_arm = {
        arm: round(statistics.median(f["first_over_warm_sdk"] for f in firsts if f["first_arm"] == arm), 3)
        for arm in ("raystack", "sdk")
        if any(f["first_arm"] == arm for f in firsts)
    }
    lines.append(f"first job over the warm SDK median, median by the arm that went first: {by_arm}")
    publish(
        os.environ.get("RAYSTACK_BENCH_NAME", "start_ab"),
        "\n".join(lines),
        {
            "rounds": args.rounds,
            "clusters": args.clusters,
            "runs": {k: [round(x, 3) for x in v] for k, v in runs.items()},
            "ratio": ratio,
            "pairs": pairs,
            "first_jobs": firsts,
            "first_job_over_warm_sdk": by_arm,
        },
    )


if __name__ == "__main__":
    main()
