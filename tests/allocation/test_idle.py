"""Idle autostop's decisions against a fake Jobs API and clock (no Ray): never while anything is
queued, in flight, running in Ray or attached; the clock restarts at every busy check; the
decision refuses new submissions; a failing check counts as busy. On a real cluster:
tests/testbed/test_monitor.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from raystack.allocation.elastic.idle import IdleWatch
from raystack.errors import ClusterError
from raystack.spec.values import duration_text
from raystack.store import cluster as clusters
from raystack.store import queue
from raystack.store.cluster import ClusterRecord, ClusterState, EndKind
from raystack.store.ledger import JobRequest
from raystack.walltime import classify


@dataclass
class RayJob:
    status: str
    submission_id: str | None = "raysubmit_1"
    job_id: str | None = "01000000"
    type: str = "SUBMISSION"
    metadata: dict = field(default_factory=dict)


class FakeDashboard:
    def __init__(self) -> None:
        self.jobs: list[RayJob] = []
        self.fail = False

    def list_jobs(self) -> list[RayJob]:
        if self.fail:
            raise ConnectionError("refused")
        return self.jobs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path / "rs"))
    clusters.create("c")
    clusters.write(ClusterRecord(name="c", state=ClusterState.READY, allocation_id="100", chain_count=3))
    return tmp_path


def watch(dash: FakeDashboard, clock: Clock, timeout: float | None = 60) -> IdleWatch:
    return IdleWatch("c", timeout, lambda: dash, every=10, clock=clock)  # type: ignore[arg-type,return-value]


def enqueue() -> str:
    request = JobRequest(id=f"j-{time.time_ns() % 10**8:08d}", name="j", cluster="c", entrypoint="true")
    return queue.enqueue(request).id


def test_idle_for_the_timeout_ends_the_cluster_and_refuses_new_jobs(home: Path) -> None:
    dash, clock = FakeDashboard(), Clock()
    w = watch(dash, clock)
    assert clusters.read("c").idle_since is not None  # READY starts the clock
    clock.now += 30
    assert w() is None
    clock.now += 31
    why = w()
    assert why is not None and "idle for 1m1s" in why and "idle timeout 1m" in why
    record = clusters.read("c")
    assert record.state is ClusterState.STOPPING and record.ending is EndKind.IDLE
    assert record.chain_ended and "autostop" in record.chain_ended
    end = classify(record, "100")
    assert end.kind == "idle" and not end.chain_goes_on and "autostop" in end.text
    with pytest.raises(ClusterError, match="STOPPING"):
        enqueue()


@pytest.mark.parametrize(
    "busy",
    ["queued", "ray_job", "driver", "pending", "api_down"],
)
def test_never_while_anything_is_queued_running_or_attached(home: Path, busy: str) -> None:
    dash, clock = FakeDashboard(), Clock()
    w = watch(dash, clock)
    if busy == "queued":
        enqueue()
    elif busy == "ray_job":
        dash.jobs = [RayJob("RUNNING")]
    elif busy == "driver":
        dash.jobs = [RayJob("SUCCEEDED"), RayJob("RUNNING", submission_id=None, type="DRIVER")]
    elif busy == "pending":
        dash.jobs = [RayJob("PENDING", metadata={"raystack_job": "x"})]
    else:
        dash.fail = True
    for _ in range(30):
        clock.now += 10
        assert w() is None
    record = clusters.read("c")
    assert record.state is ClusterState.READY and record.idle_since is None
    assert w.other_jobs == (1 if busy in ("ray_job", "driver") else 0)
    if busy == "ray_job":  # a job of the queue now: the plain one is not counted on (it was, stale)
        enqueue()
        dash.jobs = []
        clock.now += 10
        assert w() is None and w.other_jobs == 0


def test_a_busy_check_restarts_the_clock(home: Path) -> None:
    dash, clock = FakeDashboard(), Clock()
    w = watch(dash, clock)
    clock.now += 50
    assert w() is None
    dash.jobs = [RayJob("RUNNING")]
    clock.now += 10
    assert w() is None and clusters.read("c").idle_since is None
    dash.jobs = [RayJob("SUCCEEDED")]
    clock.now += 10
    assert w() is None and clusters.read("c").idle_since is not None
    clock.now += 55  # 55 s since the job ended: not yet
    assert w() is None
    clock.now += 10
    assert w() is not None


def test_without_a_timeout_it_only_tracks(home: Path) -> None:
    dash, clock = FakeDashboard(), Clock()
    w = watch(dash, clock, timeout=None)
    clock.now += 10**6
    assert w() is None and clusters.read("c").state is ClusterState.READY


def test_a_walltime_warning_or_down_first_wins(home: Path) -> None:
    dash, clock = FakeDashboard(), Clock()
    w = watch(dash, clock)
    clusters.update("c", ending="walltime")
    clock.now += 100
    assert w() is None and clusters.read("c").ending == "walltime"


def test_duration_text() -> None:
    assert [duration_text(s) for s in (0, 59, 90, 1800, 5400, 86400, 172800, 31535999)] == [
        "0s",
        "59s",
        "1m30s",
        "30m",
        "1h30m",
        "24h",
        "2d",
        "364d23h",  # (SLURM's start estimate behind a job without a time limit: a year away)
    ]
