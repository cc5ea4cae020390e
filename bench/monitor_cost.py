"""Benchmark: what watching a cluster costs (issue: top, report, usage samples).

  sample   one usage sample of a node program (UsageSampler.sample: node CPU and memory, the
           CPU of each of its descendant processes, nvidia-smi where found) with 0, 64 and 256
           child processes, beside the node-level reading alone (psutil's CPU % and memory:
           what Ray's own reporter also reads) in the same run; as ms per sample and as the
           share of one core at one sample every 10 s
  report   `raystack report`'s figures and PNG for a synthetic 24 h allocation of 16 nodes x 4
           GPUs sampled every 10 s (138,240 samples, 2.2 MB per node) with 40 jobs, beside the
           time to read the samples alone
No cluster needed. Target: a sample well under 1% of a core; a 24 h report in seconds.

    python bench/monitor_cost.py
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402
from _report import publish  # noqa: E402

from raystack.allocation.node.usage import UsageSampler  # noqa: E402
from raystack.client import report  # noqa: E402
from raystack.store import cluster as clusters  # noqa: E402
from raystack.store import paths  # noqa: E402
from raystack.store.cluster import ClusterRecord, ClusterState  # noqa: E402
from raystack.store.ledger import JobRecord, JobRequest  # noqa: E402
from raystack.store.usage import read_samples  # noqa: E402


def timed(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def sampling(children: int) -> dict:
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(children)]
    try:
        sampler = UsageSampler("bench", "1", "node")
        sampler.sample()
        full = timed(sampler.sample, 20)
        base = timed(lambda: (psutil.cpu_percent(None), psutil.virtual_memory()), 20)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return {"children": children, "sample_ms": round(full, 2), "node_only_ms": round(base, 3)}


def synthetic(nodes: int = 16, gpus: int = 4, hours: float = 24, every: float = 10, jobs: int = 40):
    t0 = time.time() - hours * 3600
    end = t0 + hours * 3600
    spans, t = [], t0 + 300
    rng = random.Random(1)
    for _ in range(jobs):
        length = rng.uniform(0.3, 1.0) * hours * 3600 / jobs
        spans.append((t, t + length))
        t += length + rng.uniform(0, 0.2) * hours * 3600 / jobs
    p = paths.cluster("bench")
    p.usage.mkdir(parents=True, exist_ok=True)
    for n in range(nodes):
        lines, t = [], t0
        while t < end:
            busy = any(a <= t <= b for a, b in spans)
            util = 90.0 if busy else 0.0
            line = {"t": round(t, 2), "cpu": 40.0, "ours": 8.0, "mem": 2**36, "mem_total": 2**39,
                    "gpus": [[util, 60000.0, 97871.0]] * gpus}  # fmt: skip
            if n == 0:
                line["other_jobs"] = 0
            lines.append(json.dumps(line, separators=(",", ":")))
            t += every
        (p.usage / f"1-node{n:02d}.jsonl").write_text("\n".join(lines) + "\n")
    record = ClusterRecord(
        name="bench", state=ClusterState.STOPPED, allocation_id="1", nodes_expected=nodes,
        allocations=[{"alloc_id": "1", "started": t0, "ready": t0 + 60, "ended": end, "nodes": nodes}],
    )  # fmt: skip
    clusters.write(record)
    records = []
    for i, (a, b) in enumerate(spans):
        req = JobRequest(id=f"j-{i:03d}", name="j", cluster="bench", entrypoint="true")
        history = [{"state": "QUEUED", "time": t0, "message": ""}, {"state": "SUBMITTED", "time": a, "message": ""},
                   {"state": "SUCCEEDED", "time": b, "message": ""}]  # fmt: skip
        records.append(JobRecord(id=req.id, name="j", request=req, history=history, state="SUCCEEDED"))
    size = (p.usage / "1-node00.jsonl").stat().st_size
    return record, records, size


def main() -> None:
    with tempfile.TemporaryDirectory() as home:
        os.environ["RAYSTACK_HOME"] = home
        clusters.create("bench")
        rows = [sampling(n) for n in (0, 64, 256)]
        record, jobs, size = synthetic()
        p = paths.cluster("bench")
        t = time.perf_counter()
        count = sum(len(read_samples(f)) for f in sorted(p.usage.glob("*.jsonl")))
        read_s = time.perf_counter() - t
        t = time.perf_counter()
        figures = report.summarize(record, jobs)
        summary_s = time.perf_counter() - t
        t = time.perf_counter()
        report.plot(figures, record, Path(home) / "r.png")
        plot_s = time.perf_counter() - t
    table = [f"{'children':>8} {'sample ms':>10} {'node only ms':>13} {'core share at 10 s':>19}"]
    for r in rows:
        table.append(f"{r['children']:>8} {r['sample_ms']:>10.2f} {r['node_only_ms']:>13.3f} "
                     f"{r['sample_ms'] / 10000:>18.4%}")  # fmt: skip
    table += [
        f"report, 24 h x 16 nodes ({count} samples, {size / 1e6:.1f} MB per node, 40 jobs):",
        f"  read the samples {read_s:.2f} s, figures {summary_s:.2f} s (incl. reading), PNG {plot_s:.2f} s",
        f"  busy {figures['busy_fraction']:.0%}, GPU util while busy {figures['gpu_util_busy']}%",
    ]
    publish(
        "monitor_cost",
        "\n".join(table),
        {
            "sampling": rows,
            "report_24h_16_nodes": {
                "samples": count,
                "bytes_per_node": size,
                "read_s": round(read_s, 2),
                "summarize_s": round(summary_s, 2),
                "plot_s": round(plot_s, 2),
            },
        },
    )


if __name__ == "__main__":
    main()
