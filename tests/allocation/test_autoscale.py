"""The queue asking for nodes (allocation/elastic/autoscale.py): how many it wants, one grow at a time
within max_nodes, what `status` and `queue` say meanwhile, idle grown nodes released."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.adapters.ray import NodeSummary
from raystack.allocation.elastic.autoscale import Autoscale, wanted
from raystack.store import cluster as records
from raystack.store import node_entries, queue
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.ledger import Attempt, JobRecord, JobRequest, JobState, read_job


def job(needs: dict[str, int], running: bool = False) -> JobRecord:
    request = JobRequest(id="j", name="j", cluster="c", entrypoint="x", needs=needs)
    attempts = [Attempt(id="j", allocation="7", at=0.0)] if running else []
    state = JobState.RUNNING if running else JobState.QUEUED
    return JobRecord(id="j", name="j", request=request, attempts=attempts, state=state)


def test_what_the_queue_wants() -> None:
    record = ClusterRecord(name="c", nodes_expected=1, gpus_per_node=4, cpus_per_node=16)
    assert wanted(record, [job({"nodes": 1}, running=True), job({"nodes": 1}), job({"nodes": 1})]) == 3
    assert wanted(record, [job({"gpus": 8}), job({"cpus": 20})]) == 4  # (rounded up to whole nodes)
    # A job that declares nothing takes the cluster as it is: in flight, all of it; waiting, no more.
    assert wanted(record, [job({}, running=True), job({})]) == 1


class FakeRay:
    def __init__(self) -> None:
        self.work: list[str] = []

    def alive_nodes(self) -> list[NodeSummary]:
        return [NodeSummary("n-head", "10.0.0.1", True, {}), NodeSummary("n-grown", "10.0.0.3", False, {})]

    def node_work(self, node_id: str) -> list[str]:
        return self.work if node_id == "n-grown" else []


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    records.create("c")
    records.update("c", state=ClusterState.READY, nodes_expected=1, max_nodes=3, idle_timeout=60.0)
    node_entries.write_node_entry("c", "a", {"ip": "10.0.0.1", "alloc_id": "7"})
    node_entries.write_node_entry("c", "g", {"ip": "10.0.0.3", "alloc_id": "8"})
    return "c"


def queued(n: int) -> list[str]:
    ids = []
    for i in range(n):
        record = queue.enqueue(
            JobRequest(id=f"j-{i}", name="j", cluster="c", entrypoint="x", needs={"nodes": 1})
        )
        ids.append(record.id)
    return ids


def test_it_grows_by_what_is_missing_within_max_nodes_once_at_a_time(cluster: str) -> None:
    asked: list[int] = []
    now = [1000.0]

    def grow(name: str, nodes: int, walltime: float | None, like: object = None) -> str:
        asked.append(nodes)
        return "8"

    scale = Autoscale(cluster, lambda: None, lambda: now[0], grow)
    first, *_ = queued(5)  # (5 one-node jobs; at most 3 nodes)
    scale()
    assert asked == [2]  # (3 - the 1 held)
    record = records.read(cluster)
    assert record.grown[0].auto and record.scaling == "waiting for 2 more nodes (allocation 8 submitted)"
    assert read_job(cluster, first).message == record.scaling  # (`raystack queue` says it too)
    now[0] += 10
    scale()  # (its allocation waits in the scheduler: no second one)
    assert asked == [2]
    assert records.read(cluster).scaling.startswith("waiting for 2 more nodes (allocation 8 ")  # type: ignore[union-attr]


def test_beside_a_head_without_gpus_it_grows_gpu_nodes_like_those_grown_before(cluster: str) -> None:
    """The heterogeneous cluster: a CPU head, one GPU node grown from the `gpu` partition. Jobs
    that need 4 GPUs each count GPU nodes; the queue asks for more of that partition and shape."""
    asked: list[tuple[int, object]] = []

    def grow(name: str, nodes: int, walltime: float | None, like: object = None) -> str:
        asked.append((nodes, like))
        return "9"

    records.update(cluster, gpus_per_node=0, cpus_per_node=8)
    records.note_grown(cluster, "8", nodes=1, gpus_per_node=4, cpus_per_node=32, queue="gpu", hosts=["g"])
    for i in range(2):
        queue.enqueue(JobRequest(id=f"g-{i}", name="g", cluster="c", entrypoint="x", needs={"gpus": 4}))
    Autoscale(cluster, lambda: None, lambda: 1000.0, grow)()
    ((nodes, like),) = asked
    assert nodes == 1 and like == records.read(cluster).grown[0], asked  # (2 GPU nodes wanted, 1 held)


def test_an_idle_grown_allocation_is_released_after_the_idle_timeout(cluster: str) -> None:
    ray, now = FakeRay(), [1000.0]
    records.note_grown(cluster, "8", nodes=1, auto=True, hosts=["g"])
    scale = Autoscale(cluster, lambda: ray, lambda: now[0], lambda *a: "9")  # type: ignore[arg-type,return-value]
    ray.work = ["05000000"]
    scale()
    now[0] += 100
    scale()  # (busy until now: its idle clock starts here)
    assert not records.read(cluster).grown[0].leaving
    ray.work = []
    now[0] += 10
    scale()
    now[0] += 55
    scale()
    assert not records.read(cluster).grown[0].leaving
    now[0] += 5
    scale()
    assert records.read(cluster).grown[0].leaving == "idle for 1m"
