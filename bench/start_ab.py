"""Benchmark: a later job's submit -> first line through raystack against Ray's SDK, interleaved.

On one warm `up --local` cluster (this machine's CPUs and GPUs; the GPU machine has no SLURM),
round after round, one job of each arm (the cluster's first job is left out: queue_gap prices it):
  raystack    `Cluster.submit` of a job printing its start time (the queue, its runner, Ray)
  sdk         Ray's JobSubmissionClient, the same entrypoint, nothing else
  sdk_as_rs   the SDK replaying what the runner sent Ray for such a job (its entrypoint, with the
              runtime_env variables and metadata every job gets), the same each round
  sdk_unique  the same with RAYSTACK_JOB_ID unique to each job (as the runner's are): whether a
              runtime_env that differs from job to job costs Ray's start anything
Each arm's median and its ratio to the SDK's (issue 43: later jobs <= 1.0x); pair by pair too.
It separates what raystack sends (sdk_as_rs, sdk_unique) from what it does around a job
(raystack against sdk_as_rs).

    python bench/start_ab.py [--rounds 8]
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


def sent(sdk: Any, cluster: Cluster) -> dict[str, Any]:
    """What the runner submitted to Ray for a raystack job, as submit_job's arguments."""
    job = cluster.submit(["python", "-c", FIRST], sets=["name=ab"])
    job.wait(timeout=300)
    info = sdk.get_job_info(job.record().attempts[-1].id)
    metadata = {k: v for k, v in (info.metadata or {}).items() if k != "job_submission_id"}
    return {"entrypoint": info.entrypoint, "runtime_env": info.runtime_env, "metadata": metadata}


def via_sdk(sdk: Any, arm: str, runner: dict[str, Any]) -> float:
    if arm == "sdk":
        return sdk_first_line(sdk, f'python -c "{FIRST}"')
    options = dict(runner)
    if arm == "sdk_unique":
        env = {**options["runtime_env"]["env_vars"], "RAYSTACK_JOB_ID": uuid.uuid4().hex}
        options["runtime_env"] = {**options["runtime_env"], "env_vars": env}
    return sdk_first_line(sdk, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    cluster = Cluster.up_local(name=f"ab{os.getpid()}", timeout=300)
    try:
        sdk = cluster.dashboard().jobs
        runner = sent(sdk, cluster)  # (and the cluster's first jobs, not counted)
        via_sdk(sdk, "sdk", runner)
        runs: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                runs[arm].append(via_raystack(cluster) if arm == "raystack" else via_sdk(sdk, arm, runner))
    finally:
        cluster.down()
    med = {arm: statistics.median(v) for arm, v in runs.items()}
    ratio = {arm: round(med[arm] / med["sdk"], 3) for arm in ARMS}
    pairs = [round(a / b, 2) for a, b in zip(runs["raystack"], runs["sdk"], strict=True)]
    lines = [f"{'arm':12} {'median s':>9} {'/ sdk':>7}  runs"]
    lines += [
        f"{arm:12} {med[arm]:>9.3f} {ratio[arm]:>7.3f}  {' '.join(f'{x:.2f}' for x in runs[arm])}"
        for arm in ARMS
    ]
    lines.append(
        f"raystack / sdk pair by pair: {pairs}; {args.rounds} rounds interleaved, one warm local cluster"
    )
    publish(
        os.environ.get("RAYSTACK_BENCH_NAME", "start_ab"),
        "\n".join(lines),
        {
            "rounds": args.rounds,
            "runs": {k: [round(x, 3) for x in v] for k, v in runs.items()},
            "ratio": ratio,
            "pairs": pairs,
        },
    )


if __name__ == "__main__":
    main()
