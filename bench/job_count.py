"""Benchmark: does a job start later once the cluster has run many? (issue 43: the first job
starts as fast as the hundredth.)

On one warm cluster (the 4-node testbed, or `--local`: this machine), in the same run, N trivial
jobs in ten batches (a sweep of N/10 jobs queued at once behind a short blocker, run back to back),
and after each batch its baseline, Ray's SDK: submit -> first line of the same entrypoint, 3 jobs.
  per tenth   the queue's part (the job before ended -> this one submitted, from its ledger),
              Ray's part (submitted -> the entrypoint's first line) and both together, medians;
              the SDK's median of the same moment (these machines drift by 20% in minutes)
  queue       `raystack queue` (a new process, as a user runs it) before and after: the ledger
              then holds N more finished jobs
Headline: the last tenth's end -> first line over the SDK's then, against the same for the first
tenth. Target <= 1.1x; the SDK's own last / first beside it (whether Ray's start moved).

    python bench/job_count.py [--local] [--jobs 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from queue_gap import FIRST, floor, trivial, up  # noqa: E402
from queue_scale import queue_cmd_s  # noqa: E402

from raystack import Cluster  # noqa: E402

TARGET = 1.1
PARTS = ("seen", "closed", "free", "pass", "submit", "start", "end_to_submitted", "end_to_first_line")


def tenth(done: int, gaps: list[dict[str, float]], sdk: list[float]) -> dict[str, Any]:
    row: dict[str, Any] = {"jobs": f"{done + 1}-{done + len(gaps)}"}
    row.update({k: round(statistics.median(g[k] for g in gaps), 3) for k in PARTS})
    row["sdk"] = round(statistics.median(sdk), 3)
    row["over_sdk"] = round(row["end_to_first_line"] / row["sdk"], 3)
    return row


def measure(cluster: Cluster, n: int) -> dict[str, Any]:
    warm = cluster.submit(["python", "-c", FIRST], sets=["name=warm"])  # (the first job's cold start)
    warm.wait(timeout=300)
    queue_before, rows, size = queue_cmd_s(cluster), [], max(1, n // 10)
    for b in range(10):
        gaps = trivial(cluster, size, hold_s=max(3, size // 3), tag=f"b{b}-")
        rows.append(tenth(b * size, gaps, floor(cluster, 3)))
    first, last = rows[0], rows[-1]
    return {
        "jobs": size * 10,
        "tenths": rows,
        "queue_cmd_s": {"before": round(queue_before, 3), "after": round(queue_cmd_s(cluster), 3)},
        "ratio_last_to_first": round(last["over_sdk"] / first["over_sdk"], 3),
        "absolute_last_to_first": round(last["end_to_first_line"] / first["end_to_first_line"], 3),
        "sdk_last_to_first": round(last["sdk"] / first["sdk"], 3),
        "target": TARGET,
    }


def table(out: dict[str, Any]) -> str:
    head = ("jobs", "end -> submitted", "Ray: -> first line", "end -> first line", "SDK then", "/ SDK")
    lines = [f"{head[0]:>9} {head[1]:>17} {head[2]:>19} {head[3]:>18} {head[4]:>9} {head[5]:>6}"]
    lines += [
        f"{r['jobs']:>9} {r['end_to_submitted']:>17.3f} {r['start']:>19.3f} {r['end_to_first_line']:>18.3f}"
        f" {r['sdk']:>9.3f} {r['over_sdk']:>6.3f}"
        for r in out["tenths"]
    ]
    q = out["queue_cmd_s"]
    lines.append(f"`raystack queue` before / after: {q['before']:.3f} / {q['after']:.3f} s")
    lines.append(
        f"last tenth / first, each over the SDK then: {out['ratio_last_to_first']}x (target <= {TARGET}x); "
        f"end -> first line alone {out['absolute_last_to_first']}x, the SDK's own {out['sdk_last_to_first']}x"
    )
    return "\n".join(lines)


def main() -> None:
    from _report import bench_home, publish

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--local", action="store_true", help="a local cluster on this machine, not the testbed"
    )
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    bench_home("bench-count-", args.local)
    cluster = up("count", args.local)
    try:
        out = measure(cluster, args.jobs)
    finally:
        cluster.down()
    out["where"] = "local" if args.local else "testbed 4 nodes"
    publish("job_count" + ("_local" if args.local else ""), table(out), out)


if __name__ == "__main__":
    main()
