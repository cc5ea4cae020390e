"""Benchmark: the dead time between two queued jobs, part by part, and with a pip environment.

On one cluster (the 4-node testbed, or `--local`: this machine), in the same run:
  trivial   a 5 s job, then N jobs that print their start time, queued behind it: N gaps. Each
            gap is split with the times the runner writes into the next job's ledger (`gap`):
              seen      the end in Ray (its end_time) -> the runner knew it
              closed    -> its log complete, its ledger written
              free      -> its resources were found free (actors, placement groups, GPUs)
              pass      -> the next job's submit began
              submit    -> the Jobs API answered (Ray's start_time: the job exists in Ray)
              start     -> the entrypoint's first line (Ray's supervisor, runtime_env, driver)
            and "end -> submitted" (the queue's part), "end -> first line" (all of it).
  floor     Ray's SDK on the same cluster: submit -> first line of the same job, one at a time,
            each right after one of the 5 jobs through the queue on an idle cluster (`later`).
  pip       a 20 s job, then a job whose runtime_env installs a pip package from a local wheel
            folder (a fresh name each time: nothing cached), with the runner preparing it while
            the first one runs, and on a second cluster with RAYSTACK_PREPARE=0 (as before):
            end -> first line. The pip setup alone: the SDK's submit -> first line of such a job
            on an idle cluster, less the floor.
Targets (issue 43): trivial end -> submitted < 0.5 s median; pip end -> first line within 1 s
of the trivial job's.

    python bench/queue_gap.py [--local] [--jobs 8] [--pip 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from raystack import Cluster  # noqa: E402
from raystack.store.ledger import JobRecord, JobState  # noqa: E402

FIRST = "import time; print('FIRST_LINE', time.time(), flush=True)"
PARTS = ("seen", "closed", "free", "pass", "submit", "start")
GAP_TARGET, PIP_EXTRA_TARGET = 0.5, 1.0


def first_line(job: Any) -> float:
    return float(job.logs().split("FIRST_LINE ", 1)[1].split()[0])


def split(record: JobRecord, first: float) -> dict[str, float]:
    """One gap, part by part (seconds), from the next job's ledger and its first line."""
    g = record.gap or {}
    closed = g.get("closed", g.get("seen"))
    marks = [
        g.get("ended"),
        g.get("seen"),
        closed,
        g.get("free", closed),
        g.get("submit"),
        g.get("submitted"),
    ]
    if any(m is None for m in marks):
        raise RuntimeError(f"job {record.id} has no gap record: {g}")
    times = [float(m) for m in marks if m is not None] + [first]
    out = {part: round(b - a, 4) for part, a, b in zip(PARTS, times, times[1:], strict=False)}
    out["end_to_submitted"] = round(times[5] - times[0], 4)
    out["end_to_first_line"] = round(first - times[0], 4)
    return out


def trivial(cluster: Cluster, n: int, hold_s: float = 5, tag: str = "gap") -> list[dict[str, float]]:
    """N jobs queued behind a blocker of `hold_s` seconds (long enough for every submit), each
    gap part by part."""
    hold = cluster.submit(["python", "-c", f"import time; time.sleep({hold_s})"], sets=["name=hold"])
    jobs = [cluster.submit(["python", "-c", FIRST], sets=[f"name={tag}{i}"]) for i in range(n)]
    records = [job.wait(timeout=600) for job in [hold, *jobs]]
    bad = [r.message for r in records if r.state is not JobState.SUCCEEDED]
    if bad:
        raise RuntimeError(f"{len(bad)} jobs did not succeed: {bad[:3]}")
    return [split(r, first_line(j)) for r, j in zip(records[1:], jobs, strict=True)]


def floor(cluster: Cluster, n: int, runtime_env: dict | None = None) -> list[float]:
    """Ray's SDK on the same cluster: submit -> the entrypoint's first line, one job at a time."""
    sdk = cluster.dashboard().jobs
    return [sdk_first_line(sdk, f'python -c "{FIRST}"', runtime_env=runtime_env) for _ in range(n)]


def sdk_first_line(sdk: Any, entrypoint: str, poll: float = 0.02, **options: Any) -> float:
    """One job through Ray's SDK (`options`: submit_job's), waited for (its status asked every
    `poll` seconds) and deleted: seconds from its submit to the FIRST_LINE its entrypoint printed."""
    from ray.job_submission import JobStatus

    t0 = time.time()
    sid = sdk.submit_job(entrypoint=entrypoint, **options)
    while sdk.get_job_status(sid) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        time.sleep(poll)
    logs = sdk.get_job_logs(sid)
    if "FIRST_LINE " not in logs:
        raise RuntimeError(f"{sid}: {sdk.get_job_info(sid).message}"[-2000:])
    sdk.delete_job(sid)
    return float(logs.split("FIRST_LINE ", 1)[1].split()[0]) - t0


def pip_env(folder: Path, name: str, count: int = 1) -> dict[str, Any]:
    """A runtime_env installing `count` packages (`name`, `name_1`, ...: wheels made here, names
    of their own, so nothing is cached) with pip, offline."""
    from tests.allocation.test_packing import wheel

    names = [name] + [f"{name}_{i}" for i in range(1, count)]
    for one in names:
        wheel(folder, one, "0.1")
    return {"pip": {"packages": names, "pip_install_options": ["--no-index", f"--find-links={folder}"]}}


def pip_gap(cluster: Cluster, folder: Path, tag: str, count: int = 1, hold_s: float | None = None) -> dict:
    """A job, then a pip job queued behind it: end -> the pip job's first line, and what the
    runner prepared. The first job ends once the pip job is prepared (or after `hold_s`, for a
    cluster that does not prepare)."""
    import yaml

    renv = pip_env(folder / tag, tag, count)
    go = folder / f"{tag}.go"
    wait = f"import os, time\nwhile not os.path.exists('{go}'): time.sleep(0.02)"
    hold = cluster.submit(["python", "-c", wait], sets=[f"name=hold-{tag}", "timeout=900"])
    code = f"import time, {tag}; print('FIRST_LINE', time.time(), flush=True)"
    sets = [f"name={tag}", f"runtime_env={yaml.safe_dump(renv, default_flow_style=True).strip()}"]
    job = cluster.submit(["python", "-c", code], sets=sets)
    deadline = time.time() + (hold_s if hold_s is not None else 600)
    while time.time() < deadline and (hold_s is not None or not job.record().prepared):
        time.sleep(0.1)
    go.write_text("")
    before, record = hold.wait(timeout=600), job.wait(timeout=900)
    assert record.state is JobState.SUCCEEDED, record.message + job.logs()[-1000:]
    return {"gap": split(record, first_line(job)), "prepared": record.prepared, "ended": before.ended}


def pip_alone(cluster: Cluster, folder: Path, tag: str, count: int = 1) -> float:
    """The SDK's submit -> first line of a pip job on an idle cluster (nothing cached)."""
    return floor(cluster, 1, pip_env(folder / tag, tag, count))[0]


def up(name: str, local: bool, env: dict[str, str] | None = None, **options: Any) -> Cluster:
    """A cluster started with `env` added to the environment `up` passes to the allocation
    (`options`: the testbed allocation's, e.g. gpus_per_node)."""
    from unittest import mock

    with mock.patch.dict(os.environ, env or {}):
        if local:
            return Cluster.up_local(name=name, timeout=300)
        return Cluster.up(4, profile="testbed", name=name, timeout=300, **options)


def measure(cluster: Cluster, jobs: int, pips: int, folder: Path, count: int = 1) -> dict[str, Any]:
    """Every figure of this benchmark on `cluster` but the unprepared pip gap (`unprepared`)."""
    t0 = time.time()  # (the cluster's first job: what `up` left for it to pay)
    first = cluster.submit(["python", "-c", FIRST], sets=["name=first"])
    first.wait(timeout=300)
    first_s = first_line(first) - t0
    later, flo = [], []
    for i in range(5):  # (the next ones, on an idle queue, each beside one through Ray's SDK)
        t0 = time.time()
        job = cluster.submit(["python", "-c", FIRST], sets=[f"name=later{i}"])
        job.wait(timeout=300)
        later.append(first_line(job) - t0)
        flo += floor(cluster, 1)
    gaps = trivial(cluster, jobs)
    stamp = f"{os.getpid()}x{int(time.time()) % 100000}"
    alone = pip_alone(cluster, folder, f"rsp{stamp}a", count)
    prepared = [pip_gap(cluster, folder, f"rsp{stamp}p{i}", count) for i in range(pips)]
    med = statistics.median
    out: dict[str, Any] = {
        "gaps": gaps,
        "gap_median": {k: round(med(g[k] for g in gaps), 3) for k in gaps[0]},
        "floor_submit_to_first_line_s": [round(x, 3) for x in flo],
        "first_job_submit_to_first_line_s": round(first_s, 3),
        "later_jobs_submit_to_first_line_s": [round(x, 3) for x in later],
        "first_job_over_floor": round(first_s / med(flo), 3),
        "later_jobs_over_floor": round(med(later) / med(flo), 3),
        "pip_setup_alone_s": round(alone - med(flo), 2),
        "pip_prepared": prepared,
        "pip_unprepared": [],
    }
    trivial_first = out["gap_median"]["end_to_first_line"]
    pip_first = med(p["gap"]["end_to_first_line"] for p in prepared) if prepared else None
    out["pip_extra_s"] = round(pip_first - trivial_first, 3) if pip_first is not None else None
    out["targets"] = {
        "gap_end_to_submitted_median_under_0.5s": out["gap_median"]["end_to_submitted"] < GAP_TARGET,
        "pip_gap_within_1s_of_trivial": out["pip_extra_s"] is not None
        and out["pip_extra_s"] < PIP_EXTRA_TARGET,
        "pip_setup_alone_over_10s": out["pip_setup_alone_s"] > 10,
    }
    return out


def unprepared(cluster: Cluster, folder: Path, tag: str, count: int) -> dict[str, Any]:
    """pip_gap on a cluster started with RAYSTACK_PREPARE=0: the job before ends after 5 s."""
    return pip_gap(cluster, folder, tag, count, 5.0)


def table(out: dict[str, Any]) -> str:
    med = out["gap_median"]
    lines = [f"{'gap part (median of ' + str(len(out['gaps'])) + ')':34} {'s':>8}"]
    lines += [f"{'  ' + k:34} {med[k]:>8.3f}" for k in PARTS]
    lines += [
        f"{'end -> next submitted':34} {med['end_to_submitted']:>8.3f}",
        f"{'end -> next first line':34} {med['end_to_first_line']:>8.3f}",
        f"{'Ray SDK submit -> first line':34} {statistics.median(out['floor_submit_to_first_line_s']):>8.3f}",
        f"{'first job / SDK (target <= 1.1)':34} {out['first_job_over_floor']:>8.3f}",
        f"{'later jobs / SDK (target <= 1.0)':34} {out['later_jobs_over_floor']:>8.3f}",
        f"{'pip setup alone (SDK, idle)':34} {out['pip_setup_alone_s']:>8.2f}",
    ]
    for label, key in (
        ("pip end -> first line, prepared", "pip_prepared"),
        ("... not prepared", "pip_unprepared"),
    ):
        if out[key]:
            figures = " ".join(f"{p['gap']['end_to_first_line']:.2f}" for p in out[key])
            lines.append(f"{label:34} {figures:>8}")
    lines.append(f"targets: {out['targets']}")
    return "\n".join(lines)


def main() -> None:
    from _report import bench_home, publish

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--local", action="store_true", help="a local cluster on this machine, not the testbed"
    )
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--pip", type=int, default=2)
    parser.add_argument("--packages", type=int, default=1, help="wheels in the pip environment")
    args = parser.parse_args()
    folder = bench_home("bench-gap-", args.local) / "wheels"
    cluster = up("gap", args.local)
    try:
        out = measure(cluster, args.jobs, args.pip, folder, args.packages)
    finally:
        cluster.down()
    # The same pip gap on a cluster that does not prepare (after the first: the testbed's nodes
    # hold one cluster at a time).
    bare = up("gapbare", args.local, {"RAYSTACK_PREPARE": "0"}) if args.pip else None
    try:
        tag = f"rsn{os.getpid()}x{int(time.time()) % 100000}"
        out["pip_unprepared"] = [
            unprepared(bare, folder, f"{tag}n{i}", args.packages) for i in range(args.pip) if bare
        ]
    finally:
        if bare is not None:
            bare.down()
    out.update(jobs=args.jobs, where="local" if args.local else "testbed 4 nodes")
    publish("queue_gap" + ("_local" if args.local else ""), table(out), out)


if __name__ == "__main__":
    main()
