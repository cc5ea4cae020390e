"""Walltime on the testbed: one named cluster and its queue across a chain of short allocations.

One chain of three 3-minute allocations (2 nodes, warned 60 s before the end) carries the whole
story: the resume job runs across all three (interrupted at the walltime warning of the first,
by a killed worker node in the second), the jobs behind it run in order in the last, a min_time
job waits. While the first allocation runs, two one-node chains show the endings that stop a
chain: a hand `scancel` and `raystack down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.adapters import slurm
from raystack.adapters.allocator import AllocState
from raystack.client import Job
from raystack.store import cluster as clusters
from raystack.store import queue
from raystack.store.cluster import ClusterState
from raystack.store.ledger import JobState

from ..conftest import module_home, processes_of_job, wait_until
from .test_cluster import raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
REPO = Path(__file__).resolve().parents[2]
DEBUG = REPO / "jobs" / "debug"
SHORT = ["--profile", "testbed", "--time", "3", "--signal-lead", "60s"]


def py(code: str) -> list[str]:
    return ["python", "-c", code]


def alive(job: str | None) -> bool:
    info = slurm.job_info(job) if job else None
    return info is not None and not info.state.is_terminal()


def holds_nodes(job: str) -> bool:
    info = slurm.job_info(job)
    return info is not None and info.state is not AllocState.WAITING


def kill_node(job: str, host: str) -> int:
    """SIGKILL every process of allocation `job` on `host` (its node program and Ray): a node
    that dies under the cluster."""
    killed = 0
    for pid, _ in processes_of_job(job):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"SLURMD_NODENAME={host}\0".encode() in env:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


@pytest.fixture(scope="module")
def chain(testbed: Path) -> Iterator[dict]:
    """The three-allocation chain, started first (the other tests of this module run meanwhile)."""
    with module_home(testbed, "chain") as home:
        up = raystack("up", "--nodes", "2", *SHORT, "--chain", "3", "--name", "chain", "--no-wait")
        assert up.returncode == 0, up.stderr
        cluster = Cluster("chain")
        ckpt = home / "chain-ckpt"
        sets = [f"outputs.checkpoints={ckpt}", "stop_grace=10s"]
        entry = "python resume.py --until-chain 3 --extra-steps 10 --step-seconds 0.5 --checkpoint-every 4"
        jobs = {
            "resume": cluster.submit(DEBUG / "resume.yaml", sets=[*sets, f"entrypoint={entry}"]),
            "after1": cluster.submit(py("import os; print('after1 in', os.environ['RAYSTACK_CHAIN_INDEX'])")),
            "long": cluster.submit(py("print('long')"), sets=["name=long", "min_time=170s"]),
            "after2": cluster.submit(py("import os; print('after2 in', os.environ['RAYSTACK_CHAIN_INDEX'])")),
        }
        yield {"cluster": cluster, "jobs": jobs, "ckpt": ckpt, "home": home, "t0": time.time()}
        for job in (clusters.read("chain").allocation_id, clusters.read("chain").next_allocation_id):
            if alive(job):
                slurm.scancel(str(job))


def test_follow_on_waits_in_slurm_while_the_first_runs(chain: dict) -> None:
    cluster: Cluster = chain["cluster"]
    cluster.wait_ready(timeout=180)
    first = clusters.read("chain")
    wait_until(lambda: clusters.read("chain").next_allocation_id, 60, "the follow-on to be submitted")
    nxt = str(clusters.read("chain").next_allocation_id)
    info = slurm.job_info(nxt)
    assert info is not None and info.state is AllocState.WAITING and info.reason == "Dependency"
    st = json.loads(raystack("status", "chain", "--json").stdout)
    assert (st["chain_index"], st["chain_count"], st["next_allocation_id"], st["next_state"]) == (
        1,
        3,
        nxt,
        "PENDING",
    )
    assert "allocation 1 of 3; next: job" in raystack("status", "chain").stdout
    chain["first"] = first.allocation_id
    wait_until(lambda: chain["jobs"]["resume"].state is JobState.RUNNING, 120, "the resume job to run")


def test_scancel_by_hand_ends_its_chain(rs_home: Path) -> None:
    up = raystack("up", "--nodes", "1", *SHORT, "--chain", "2", "--name", "sc")
    assert up.returncode == 0, up.stderr
    wait_until(lambda: clusters.read("sc").next_allocation_id, 60, "the follow-on to be submitted")
    record = clusters.read("sc")
    first, nxt = str(record.allocation_id), record.next_allocation_id
    assert alive(nxt)
    slurm.scancel(first)
    wait_until(lambda: clusters.read("sc").state.is_terminal(), 60, "the cluster to end")
    record = clusters.read("sc")
    assert record.state is ClusterState.STOPPED and "cancelled by scancel" in record.message, record.message
    assert f"the pending allocation {nxt} was cancelled" in str(record.chain_ended)
    wait_until(lambda: not alive(first), 60, "the allocation to end")
    assert not alive(nxt) and slurm.jobs_named("raystack-sc") == {}  # nothing left in SLURM


def test_down_during_a_chain_leaves_nothing_in_slurm(rs_home: Path) -> None:
    up = raystack("up", "--nodes", "1", *SHORT, "--chain", "3", "--name", "dn")
    assert up.returncode == 0, up.stderr
    wait_until(lambda: clusters.read("dn").next_allocation_id, 60, "the follow-on to be submitted")
    nxt = clusters.read("dn").next_allocation_id
    done = raystack("down", "dn")
    assert done.returncode == 0, done.stderr
    record = clusters.read("dn")
    assert record.state is ClusterState.STOPPED and record.chain_ended == "raystack down"
    assert not alive(record.allocation_id) and not alive(nxt)
    assert slurm.jobs_named("raystack-dn") == {}  # no allocation runs or waits


def test_a_requeued_allocation_runs_again_and_its_job_resumes(rs_home: Path) -> None:
    """`scontrol requeue` (by an administrator, or a preemption or node failure that requeues):
    before, the head took it for a scancel (the running job FAILED), and when SLURM ran the
    allocation again under its id its workers found the cluster STOPPED and left, so the head
    waited for them until join_timeout and the cluster FAILED."""
    up = raystack("up", "--nodes", "2", "--profile", "testbed", "--name", "rq")
    assert up.returncode == 0, up.stderr
    cluster = Cluster("rq")
    alloc = str(clusters.read("rq").allocation_id)
    try:
        job = cluster.submit(
            py("import time; time.sleep(15); print('done', flush=True)"), sets=["name=rqjob"]
        )
        wait_until(lambda: job.record().state is JobState.RUNNING, 60, "the job to run")
        subprocess.run(["scontrol", "requeue", alloc], check=True)
        wait_until(lambda: clusters.read("rq").state is ClusterState.SUBMITTED, 60, "the requeue recorded")
        assert "was requeued by SLURM" in clusters.read("rq").message
        assert job.record().state is JobState.INTERRUPTED
        # SLURM holds a requeued job back for a while (BeginTime): let it start now.
        wait_until(lambda: alive(alloc) and not holds_nodes(alloc), 60, "the job to wait in SLURM")
        subprocess.run(["scontrol", "update", f"jobid={alloc}", "starttime=now"], check=True)
        cluster.wait_ready(timeout=180)
        record = clusters.read("rq")
        assert (record.allocation_id, record.allocation_restart, record.nodes_joined) == (alloc, 1, 2)
        ended = job.wait(timeout=120)
        assert ended.state is JobState.SUCCEEDED and len(ended.attempts) == 2, ended.message
        assert "done" in job.logs()
    finally:
        raystack("down", "rq")


def test_a_killed_worker_node_does_not_end_the_chain(chain: dict) -> None:
    """Allocation 1 ends at its walltime (the job resumes in 2); in 2 a worker node dies: the
    head interrupts the job and ends the allocation early, and 3 takes over."""
    first = chain.get("first") or clusters.read("chain").allocations[0].alloc_id
    wait_until(lambda: clusters.read("chain").chain_index == 2, 300, "allocation 1 to hand over")
    record = clusters.read("chain")
    assert record.state in (ClusterState.SUBMITTED, ClusterState.STARTING, ClusterState.READY)
    resume: Job = chain["jobs"]["resume"]
    assert resume.record().state in (JobState.INTERRUPTED, JobState.SUBMITTED, JobState.RUNNING)
    assert any(h["state"] == "INTERRUPTED" for h in resume.record().history)
    Cluster("chain").wait_ready(timeout=240)
    second = str(clusters.read("chain").allocation_id)
    assert second != first
    wait_until(
        lambda: (r := resume.record()).state is JobState.RUNNING and r.attempts[-1].allocation == second,
        180,
        "the resume job to run in allocation 2",
    )
    wait_until(lambda: steps(chain["ckpt"])[-1][3] == second, 60, "a step in allocation 2")
    record = clusters.read("chain")
    worker = next(n for n in record.nodes if n != record.head_host)
    assert kill_node(second, worker) > 0
    wait_until(
        lambda: clusters.read("chain").chain_index == 3, 240, "allocation 2 to hand over after the lost node"
    )
    ended = next(a for a in clusters.read("chain").allocations if a.alloc_id == second)
    assert ended.reason == "a node was lost", ended


def steps(ckpt: Path) -> list[tuple[int, int, float, str]]:
    lines = (ckpt / "steps.log").read_text().split("\n") if (ckpt / "steps.log").exists() else []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 4:
            out.append((int(parts[0]), int(parts[1]), float(parts[2]), parts[3]))
    return out or [(0, 0, 0.0, "")]


def test_the_job_resumes_across_three_allocations_and_the_queue_follows(chain: dict) -> None:
    jobs: dict[str, Job] = chain["jobs"]
    record = jobs["resume"].wait(timeout=420)
    assert record.state is JobState.SUCCEEDED, jobs["resume"].logs()[-2000:]
    allocations = [a.allocation for a in record.attempts]
    assert len(set(allocations)) == 3 and record.interruptions == 2, record.attempts
    assert [h["state"] for h in record.history].count("INTERRUPTED") == 2
    # Steps: each run starts at the last checkpoint; after removing what was redone since it,
    # every step from 1 to the end was done exactly once, and never more than one interval redone.
    trace = steps(chain["ckpt"])
    final = max(s for _, s, _, _ in trace)
    kept: dict[int, int] = {}
    redone = 0
    for run, step, _, _ in trace:
        if step in kept:
            redone += 1
            assert run > kept[step]
        kept[step] = run
    assert sorted(kept) == list(range(1, final + 1))
    assert redone <= 2 * 4  # at most one checkpoint interval (4 steps) per interruption
    # The jobs queued behind it ran after it, in order, in the last allocation; the min_time job
    # (needs 170 s, the allocation had less left) waits.
    a1, a2 = jobs["after1"].wait(timeout=240), jobs["after2"].wait(timeout=240)
    assert a1.state is a2.state is JobState.SUCCEEDED
    assert record.ended <= a1.started <= a2.started  # type: ignore[operator]
    assert "after1 in 3" in jobs["after1"].logs() and "after2 in 3" in jobs["after2"].logs()
    long = jobs["long"].record()
    assert long.state is JobState.QUEUED and "waits for an allocation with 0h02m left" in long.message
    assert queue.position("chain", long.id) == 1
    # How long from an allocation's end to the resumed job's first new step.
    ends = {a.alloc_id: a.ended for a in clusters.read("chain").allocations if a.ended}
    gaps = []
    for alloc, ended in ends.items():
        after = [t for _, _, t, a in trace if a != alloc and t > ended]
        if after:
            gaps.append(round(min(after) - ended, 1))
    minutes = round((time.time() - chain["t0"]) / 60, 1)
    report = {"final_step": final, "redone": redone, "resume_gaps_s": gaps, "minutes": minutes}
    print(f"CHAIN {json.dumps(report)}")
    Cluster("chain").down()
    record = clusters.read("chain")
    assert (
        record.state is ClusterState.STOPPED
        and not alive(record.allocation_id)
        and not alive(record.next_allocation_id)
    )
