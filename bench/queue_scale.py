"""Benchmark: does the queue's cost grow with its length?

On one warm 1-node testbed cluster, for N = 10, 100, 1,000 and 10,000 jobs waiting behind a
running blocker job, in the same run:
  submit      latency of Cluster.submit (one more job, API call: spec -> ledger -> queue file)
  queue       latency of the `raystack queue` command (a new process, as a user runs it)
  runner CPU  the queue runner's CPU use over 10 s while N jobs wait (it polls every 0.1 s)
  gap         end of one job -> start of the next, for the first 5 jobs once the blocker ends
Then the waiting jobs are cancelled and the next N is measured. Target: every figure flat within
2x from N=10 to N=10,000 (the N=10 row is the baseline of the same run).

    python bench/queue_scale.py [--sizes 10 100 1000 10000] [--window 10]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import on_testbed, publish  # noqa: E402

from raystack import Cluster  # noqa: E402
from raystack.client import Job  # noqa: E402
from raystack.errors import ClusterError  # noqa: E402
from raystack.spec.load import command_spec  # noqa: E402
from raystack.spec.resolve import new_job_id, resolve  # noqa: E402
from raystack.store import queue  # noqa: E402
from raystack.store.ledger import JobState  # noqa: E402

TARGET = 2.0
CLK = os.sysconf("SC_CLK_TCK")


def runner_pid(job_id: str) -> int:
    """The runner as seen from the host (its own pid is in the node's PID namespace)."""
    needle = f"SLURM_JOB_ID={job_id}\0".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (
                    needle in (proc / "environ").read_bytes()
                    and b"raystack.allocation.runner" in (proc / "cmdline").read_bytes()
                ):
                    return int(proc.name)
            except OSError:
                continue
    raise RuntimeError("no queue runner found")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def fill(cluster: Cluster, n: int) -> None:
    """N jobs in the queue, through the same path as submit but without N process start-ups."""
    record = cluster.record()
    spec = command_spec(["python", "-c", "pass"])
    for _ in range(n):
        request = resolve(spec, record, Path.cwd(), "bench")
        queue.enqueue(request, new_id=new_job_id)


def queue_cmd_s(cluster: Cluster, n: int = 3) -> float:
    """Median seconds of `raystack queue NAME` in a new process, as a user runs it."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "raystack.cli", "queue", cluster.name], capture_output=True, check=True
        )
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(cluster: Cluster, n: int, window: float) -> dict:
    blocker = cluster.submit(["python", "-c", "import time; time.sleep(3600)"], sets=["name=blocker"])
    while blocker.state is not JobState.RUNNING:
        time.sleep(0.1)
    fill(cluster, n)
    submit_s = []
    for _ in range(10):
        t0 = time.perf_counter()
        cluster.submit(["python", "-c", "pass"], sets=["name=probe"])
        submit_s.append(time.perf_counter() - t0)
    queue_s = queue_cmd_s(cluster)
    pid = runner_pid(str(cluster.record().allocation_id))
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    cpu_pct = 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    first = [e.job_id for e in queue.waiting(cluster.name)[:5]]
    blocker.stop(wait=True)
    records = [Job(cluster.name, j).wait(timeout=300) for j in first]
    gaps = [b.started - a.ended for a, b in itertools.pairwise(records) if a.ended and b.started]
    for entry in queue.waiting(cluster.name):
        with contextlib.suppress(ClusterError):  # the runner may take one off the queue meanwhile
            queue.cancel(cluster.name, entry.job_id)
    for job_id in queue.active(cluster.name):
        Job(cluster.name, job_id).wait(timeout=300)
    return {
        "n": n,
        "submit_s": statistics.median(submit_s),
        "queue_cmd_s": queue_s,
        "runner_cpu_pct": cpu_pct,
        "gap_s": statistics.mean(gaps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--window", type=float, default=10.0, help="seconds of runner CPU measured")
    args = parser.parse_args()
    on_testbed("bench-scale-")
    cluster = Cluster.up(1, profile="testbed", name="scale", timeout=300)
    try:
        cluster.submit(["python", "-c", "pass"], sets=["name=warmup"]).wait(timeout=300)
        rows = [measure(cluster, n, args.window) for n in args.sizes]
    finally:
        cluster.down()
    base = rows[0]
    keys = ("submit_s", "queue_cmd_s", "runner_cpu_pct", "gap_s")
    ratios = {k: max(r[k] for r in rows) / max(base[k], 1e-9) for k in keys}
    lines = [f"{'queued':>8} {'submit s':>9} {'queue cmd s':>12} {'runner CPU %':>13} {'gap s':>7}"]
    lines += [
        f"{r['n']:>8} {r['submit_s']:>9.3f} {r['queue_cmd_s']:>12.3f} {r['runner_cpu_pct']:>13.1f} {r['gap_s']:>7.3f}"
        for r in rows
    ]
    lines.append(
        "largest / N=10: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()) + f" (target <= {TARGET}x)"
    )
    publish(
        "queue_scale",
        "\n".join(lines),
        {
            "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
            "ratio_to_smallest": {k: round(v, 2) for k, v in ratios.items()},
            "target_flat_within_2x": all(v <= TARGET for v in ratios.values()),
        },
    )


if __name__ == "__main__":
    main()
