"""How an allocation's end is told apart, and what the record says afterwards (no SLURM: SLURM's
answers are given as recorded on the testbed; the chain itself runs in tests/testbed/test_chain.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack import walltime
from raystack.adapters import slurm
from raystack.adapters.allocator import AllocInfo
from raystack.adapters.local import LOCAL_ENDED
from raystack.adapters.slurm import parse
from raystack.store import cluster as clusters
from raystack.store import queue
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import JobRequest, JobState, read_job

NOW = 1_800_000_000.0


def rec(**fields: object) -> ClusterRecord:
    base: dict[str, object] = {
        "state": ClusterState.READY,
        "allocation_id": "7",
        "walltime_end": int(NOW) + 3600,
    }
    return ClusterRecord(name="c", **{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("record", "info", "kind"),
    [
        (rec(ending="down"), None, "down"),
        (rec(state=ClusterState.STOPPING), None, "down"),
        (rec(ending="walltime"), None, "walltime"),
        (rec(ending="node lost"), None, "node lost"),
        (rec(walltime_end=int(NOW) + 30), None, "walltime"),  # at the limit, warning or not
        # SLURM's view at the moment the steps get SIGTERM (recorded on the testbed):
        (rec(), parse.answer("7", "COMPLETING", reason="TimeLimit"), "walltime"),
        (rec(), parse.answer("7", "COMPLETING", reason="None"), "scancel"),
        (rec(), parse.answer("7", "NODE_FAIL", reason="NodeDown"), "node lost"),
        (rec(), parse.answer("7", "PREEMPTED", reason="Preempted"), "preempted"),
        (rec(), parse.answer("7", "TIMEOUT"), "walltime"),
        # a local allocation: its node program gone without a word, or sent a signal
        (rec(backend="local"), parse.answer("7", "COMPLETED", reason=LOCAL_ENDED), "failed"),
        (rec(backend="local"), parse.answer("7", "COMPLETED", reason="TimeLimit"), "scancel"),
    ],
)
def test_classify(record: ClusterRecord, info: AllocInfo | None, kind: str) -> None:
    assert walltime.classify(record, "7", info=info, now=lambda: NOW).kind == kind


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    clusters.write(rec(chain_count=3, next_allocation_id="8"))
    return tmp_path


def running_job() -> str:
    record = queue.enqueue(JobRequest(id="j-1", name="j", cluster="c", entrypoint="x"))
    assert queue.start("c", queue.waiting("c")[0], "7") is not None
    return record.id


def test_walltime_hands_the_cluster_to_the_follow_on_and_requeues(home: Path) -> None:
    job = running_job()
    clusters.update("c", allocation_restart=1)  # (allocation 7 had been requeued once)
    record = walltime.end_allocation("c", "7", walltime.ending("walltime", "walltime"), ClusterState.STOPPED)
    assert record.state is ClusterState.SUBMITTED and record.allocation_id == "8" and record.chain_index == 2
    assert record.allocation_restart == 0  # (the follow-on's first run)
    assert record.next_allocation_id is None and record.dashboard_url is None
    assert "allocation 2 of 3 is SLURM job 8" in record.message
    assert read_job("c", job).state is JobState.INTERRUPTED and queue.position("c", job) == 1
    assert [a.alloc_id for a in record.allocations] == ["7"] and record.allocations[0].reason == "walltime"


def test_scancel_ends_the_chain_and_cancels_the_follow_on(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cancelled = []
    monkeypatch.setattr(slurm, "scancel", cancelled.append)
    job = running_job()
    end = walltime.ending("scancel", "cancelled by scancel or an administrator")
    record = walltime.end_allocation("c", "7", end, ClusterState.STOPPED)
    assert record.state is ClusterState.STOPPED and cancelled == ["8"]
    assert "the pending allocation 8 was cancelled" in record.chain_ended  # type: ignore[operator]
    # (a signal from outside is no error of the job's: it waits, at the head of the queue, for the
    # cluster to be up again)
    interrupted = read_job("c", job)
    assert interrupted.state is JobState.INTERRUPTED and interrupted.interruptions == 1
    assert interrupted.message.endswith("; it resumes in the next allocation"), interrupted.message


def test_down_leaves_the_jobs_it_ended_stopped_not_failed(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person ended them (`raystack down`), as `raystack stop` would: STOPPED; a scancel from
    outside (above) interrupts them, to resume."""
    monkeypatch.setattr(slurm, "scancel", lambda alloc_id: None)
    job = running_job()
    walltime.end_allocation("c", "7", walltime.ending("down", "raystack down"), ClusterState.STOPPED)
    record = read_job("c", job)
    assert record.state is JobState.STOPPED
    assert (
        record.message.startswith("allocation 7 ended while the job was")
        and "(raystack down)" in record.message
    )


def test_a_requeued_allocation_waits_for_its_next_run_with_its_jobs_to_resume(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SLURM runs a requeued job again under its id: the record waits for it (SUBMITTED, the same
    allocation, the chain and its follow-on untouched) and the jobs in flight resume there."""
    cancelled: list[str] = []
    monkeypatch.setattr(slurm, "scancel", cancelled.append)
    job = running_job()
    end = walltime.ending("requeued", "restart 1")
    record = walltime.end_allocation("c", "7", end, ClusterState.STOPPED)
    assert (record.state, record.allocation_id, record.chain_index) == (ClusterState.SUBMITTED, "7", 1)
    assert record.next_allocation_id == "8" and cancelled == [] and record.chain_ended is None
    assert record.dashboard_url is None and "was requeued by SLURM" in record.message
    assert read_job("c", job).state is JobState.INTERRUPTED and queue.position("c", job) == 1


def test_a_later_allocation_is_never_overwritten(home: Path) -> None:
    clusters.update("c", allocation_id="9")
    record = walltime.end_allocation("c", "7", walltime.ending("scancel", "x"), ClusterState.STOPPED)
    assert record.allocation_id == "9" and record.state is ClusterState.READY


def test_follow_on_submission(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = {"name": "raystack-c", "nodes": 2, "time": "5", "native": ["--comment=x"]}
    clusters.update("c", next_allocation_id=None, request=asked)
    seen = []
    monkeypatch.setattr(slurm, "sbatch", lambda opts, script: seen.append(opts) or "8")
    assert walltime.submit_follow_on("c", "7") == "8"
    # (the request in raystack's words, the dependency in SLURM's: the adapter writes both)
    assert seen == [
        [
            "--job-name=raystack-c",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--time=5",
            "--comment=x",
            "--dependency=afterany:7",
        ]
    ]
    assert clusters.read("c").next_allocation_id == "8"
    assert walltime.submit_follow_on("c", "7") is None  # one at a time
    clusters.update("c", next_allocation_id=None, chain_index=3)
    assert walltime.submit_follow_on("c", "7") is None  # the chain is used up


def test_a_chain_an_earlier_version_began_goes_on(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its record kept sbatch's options, not a request: the follow-on asks for them as they were."""
    clusters.update("c", next_allocation_id=None, sbatch_options=["--job-name=raystack-c", "--nodes=2"])
    seen = []
    monkeypatch.setattr(slurm, "sbatch", lambda opts, script: seen.append(opts) or "8")
    assert walltime.submit_follow_on("c", "7") == "8"
    assert seen == [["--job-name=raystack-c", "--ntasks-per-node=1", "--nodes=2", "--dependency=afterany:7"]]


def test_a_job_whose_allocation_ended_unrecorded_ran_until_the_last_heartbeat(home: Path) -> None:
    """Issue 65: after a SIGKILL of the node program a job's duration counted on until a reader or
    a command noticed the end (minutes, or hours overnight). The job stopped running at the head's
    last heartbeat: readers show it so, and the settlement writes it so."""
    import os
    import time

    from raystack.cli.jobs import _ran_until
    from raystack.client import reconcile
    from raystack.store import paths
    from raystack.store.ledger import update_job

    clusters.write(rec(backend="local"))
    job = running_job()
    t0 = time.time() - 600
    update_job("c", job, state=JobState.RUNNING, started=t0)
    beat = paths.cluster("c").heartbeat
    beat.write_text("x")
    os.utime(beat, (t0 + 10, t0 + 10))  # (its node program was SIGKILLed then)
    info = parse.answer("7", "COMPLETED", reason=LOCAL_ENDED)
    record = clusters.read("c")
    pending = reconcile.pending_end(record, info)
    assert pending is not None and pending.at == pytest.approx(t0 + 10)
    seen = reconcile.job_as_ended(read_job("c", job), pending)
    assert seen.state is JobState.INTERRUPTED and _ran_until(seen) == pytest.approx(t0 + 10)
    reconcile.settle(record, info)
    settled = read_job("c", job)
    assert settled.state is JobState.INTERRUPTED and _ran_until(settled) == pytest.approx(t0 + 10)
    assert clusters.read("c").allocations[-1].ended == pytest.approx(t0 + 10)
