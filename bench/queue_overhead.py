"""Benchmark: what the queue costs per job, against the floor and against today's practice.

On one warm 4-node testbed cluster, in the same run:
  queue     10 trivial jobs (`python -c pass`) submitted at once to the raystack queue; the
            runner runs them one after another.
  floor     the same 10 jobs through Ray's own SDK on the same cluster, one after another
            (submit, poll until finished): no queue, no ledger, no log copies.
  fresh     one new allocation + cluster start per job (`raystack up`, job, `raystack down`),
            what users do today with one sbatch per run (--fresh N jobs, default 3).
Reported: submit->RUNNING latency (a job submitted to an idle queue, 10 times), the gap between
one job's end and the next one's start (Ray's own timestamps), and per-job total time.
Targets: gap < 1 s; per-job total within 1.5x of the floor.

    python bench/queue_overhead.py [--jobs 10] [--fresh 3]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import on_testbed, publish  # noqa: E402

from raystack import Cluster  # noqa: E402
from raystack.store.ledger import JobState  # noqa: E402

TRIVIAL = ["python", "-c", "pass"]
GAP_TARGET, RATIO_TARGET = 1.0, 1.5


def queue_back_to_back(cluster: Cluster, n: int) -> dict:
    start = time.time()
    jobs = [cluster.submit(TRIVIAL, sets=[f"name=b2b{i}"]) for i in range(n)]
    records = [job.wait(timeout=600) for job in jobs]
    assert all(r.state is JobState.SUCCEEDED for r in records), [r.message for r in records]
    total = max(r.ended or 0 for r in records) - start
    gaps = [b.started - a.ended for a, b in itertools.pairwise(records) if a.ended and b.started]
    return {"per_job_s": total / n, "gaps_s": gaps}


def queue_latency(cluster: Cluster, n: int) -> list[float]:
    """submit -> RUNNING for a job given to an idle queue."""
    out = []
    for i in range(n):
        job = cluster.submit(TRIVIAL, sets=[f"name=lat{i}"])
        t0 = job.record().request.queued_at
        while (record := job.record()).state is not JobState.RUNNING and not record.state.is_terminal():
            time.sleep(0.01)
        record = job.wait(timeout=600)
        running = record.time_in(JobState.RUNNING) or record.started or t0
        out.append(running - t0)
    return out


def floor(cluster: Cluster, n: int) -> dict:
    api = cluster.dashboard()
    start, latencies = time.time(), []
    for _ in range(n):
        t0 = time.time()
        sid = api.jobs.submit_job(entrypoint="python -c pass")
        seen_running = None
        while True:
            status = str(api.jobs.get_job_status(sid).value)
            if status == "RUNNING" and seen_running is None:
                seen_running = time.time()
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            time.sleep(0.01)
        latencies.append((seen_running or time.time()) - t0)
    return {"per_job_s": (time.time() - start) / n, "latency_s": latencies}


def fresh(n: int) -> float:
    """One allocation + cluster per job, as with one sbatch script per run."""
    times = []
    for i in range(n):
        t0 = time.time()
        cluster = Cluster.up(4, profile="testbed", name=f"fresh{i}", timeout=300)
        job = cluster.submit(TRIVIAL)
        assert job.wait(timeout=300).state is JobState.SUCCEEDED
        cluster.down()
        times.append(time.time() - t0)
    return statistics.mean(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--fresh", type=int, default=3)
    args = parser.parse_args()
    on_testbed("bench-queue-")
    cluster = Cluster.up(4, profile="testbed", name="bench", timeout=300)
    try:
        cluster.submit(TRIVIAL, sets=["name=warmup"]).wait(timeout=300)  # first job pays worker start-up
        flo = floor(cluster, args.jobs)
        b2b = queue_back_to_back(cluster, args.jobs)
        lat = queue_latency(cluster, args.jobs)
    finally:
        cluster.down()
    fresh_s = fresh(args.fresh) if args.fresh else None
    report(args, flo, b2b, lat, fresh_s)


def report(args: argparse.Namespace, flo: dict, b2b: dict, lat: list[float], fresh_s: float | None) -> None:
    med = statistics.median
    rows = {
        "submit_to_running_s": {"queue": round(med(lat), 3), "floor": round(med(flo["latency_s"]), 3)},
        "gap_between_jobs_s": {
            "queue_mean": round(statistics.mean(b2b["gaps_s"]), 3),
            "queue_max": round(max(b2b["gaps_s"]), 3),
        },
        "per_job_total_s": {
            "queue": round(b2b["per_job_s"], 3),
            "floor": round(flo["per_job_s"], 3),
            "fresh_allocation": round(fresh_s, 2) if fresh_s else None,
        },
    }
    ratio = b2b["per_job_s"] / flo["per_job_s"]
    rows["queue_over_floor"] = round(ratio, 3)
    rows["targets"] = {
        "gap_under_1s": max(b2b["gaps_s"]) < GAP_TARGET,
        "within_1.5x_floor": ratio <= RATIO_TARGET,
    }
    table = "\n".join(
        [
            f"{'measure':28} {'queue':>9} {'floor':>9} {'fresh alloc':>12}",
            f"{'submit -> RUNNING (median)':28} {rows['submit_to_running_s']['queue']:>9.3f} "
            f"{rows['submit_to_running_s']['floor']:>9.3f} {'':>12}",
            f"{'gap end -> next start mean':28} {rows['gap_between_jobs_s']['queue_mean']:>9.3f} {'':>9} {'':>12}",
            f"{'gap end -> next start max':28} {rows['gap_between_jobs_s']['queue_max']:>9.3f} {'':>9} {'':>12}",
            f"{'per-job total':28} {rows['per_job_total_s']['queue']:>9.3f} {rows['per_job_total_s']['floor']:>9.3f} "
            f"{(fresh_s or float('nan')):>12.2f}",
            f"queue / floor per job: {ratio:.2f}x (target <= {RATIO_TARGET}x); max gap target < {GAP_TARGET}s",
        ]
    )
    result = {
        "jobs": args.jobs,
        "fresh_jobs": args.fresh,
        "results": rows,
        "samples": {
            "queue_latency_s": [round(x, 3) for x in lat],
            "floor_latency_s": [round(x, 3) for x in flo["latency_s"]],
            "gaps_s": [round(x, 3) for x in b2b["gaps_s"]],
        },
    }
    publish("queue_overhead", table, result)


if __name__ == "__main__":
    main()
