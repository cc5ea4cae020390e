"""A grown allocation leaving (allocation/elastic/leaving.py): drained through Ray's GCS once, released when
its nodes run nothing or its deadline has passed; the head's own nodes are never drained."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from raystack.adapters.ray import NodeSummary
from raystack.adapters.slurm import parse
from raystack.allocation.elastic.leaving import Leaving
from raystack.store import cluster as records
from raystack.store import node_entries


def NOT_ENDED(backend: str, alloc_id: str) -> None:
    return None


def recorder(ran: list[list[str]]) -> Callable[[list[list[str]], dict[str, str]], list[str | None]]:
    """Stands in for `ray drain-node`: what it would have run, each drain taken."""
    return lambda argvs, env: [ran.append(a) for a in argvs] and [None for _ in argvs]


class FakeRay:
    def __init__(self) -> None:
        self.busy = {"n-grown-1": ["02000000", "02000000"], "n-grown-2": []}
        self.nodes = [
            NodeSummary("n-head", "10.0.0.1", True, {}),
            NodeSummary("n-mine", "10.0.0.2", False, {}),
            NodeSummary("n-grown-1", "10.0.0.3", False, {}),
            NodeSummary("n-grown-2", "10.0.0.4", False, {}),
        ]

    def alive_nodes(self) -> list[NodeSummary]:
        return self.nodes

    def node_work(self, node_id: str) -> list[str]:
        return self.busy[node_id]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RAYSTACK_HOME", str(tmp_path))
    records.create("c")
    records.update("c", allocation_id="7", gcs_address="10.0.0.1:6379")
    for host, ip, alloc in (
        ("a", "10.0.0.1", "7"),
        ("b", "10.0.0.2", "7"),
        ("c", "10.0.0.3", "8"),
        ("d", "10.0.0.4", "8"),
    ):
        node_entries.write_node_entry("c", host, {"ip": ip, "alloc_id": alloc})
    records.note_grown("c", "8", nodes=2, hosts=["c", "d"])
    return "c"


def test_drained_once_then_released_when_idle_or_late(cluster: str) -> None:
    ray, now, ran = FakeRay(), [1000.0], []
    leaving = Leaving(
        cluster,
        lambda: ray,
        {"RAY_AUTH_MODE": "token"},
        lambda: now[0],
        recorder(ran),
        NOT_ENDED,
    )  # type: ignore[arg-type,return-value]
    leaving()  # (nobody asked it to leave: nothing happens)
    assert ran == [] and records.read(cluster).grown[0].drained is None
    records.note_grown(cluster, "8", leaving="raystack shrink", deadline=30.0)
    leaving()
    drained = {a[3].removeprefix("--node-id=") for a in ran}
    assert drained == {"n-grown-1", "n-grown-2"}  # (its own nodes only, never the head's)
    assert all(
        "--reason=DRAIN_NODE_REASON_PREEMPTION" in a and "--deadline-remaining-seconds=30" in a for a in ran
    )
    assert records.read(cluster).grown[0].drained == 1000.0
    now[0] += 10
    leaving()  # (an actor still runs on one of them)
    assert records.read(cluster).grown[0].released is None and len(ran) == 2  # (drained once)
    ray.busy["n-grown-1"] = []
    leaving()
    assert records.read(cluster).grown[0].released == 1010.0


def test_released_at_the_deadline_while_still_busy(cluster: str) -> None:
    ray, now = FakeRay(), [1000.0]
    leaving = Leaving(cluster, lambda: ray, {}, lambda: now[0], recorder([]), NOT_ENDED)  # type: ignore[arg-type]
    records.note_grown(cluster, "8", leaving="raystack shrink", deadline=30.0)
    leaving()
    now[0] += 29
    leaving()
    assert records.read(cluster).grown[0].released is None
    now[0] += 1
    leaving()
    assert records.read(cluster).grown[0].released == 1030.0


def test_the_walltime_warning_of_a_grown_allocation_makes_it_leave(cluster: str) -> None:
    """Its script left SLURM's warning flag, as the head's does: drained with what time remains."""
    from raystack.store import paths

    ray, now, ran = FakeRay(), [1000.0], []
    records.note_grown(cluster, "8", walltime_end=1100)
    leaving = Leaving(cluster, lambda: ray, {}, lambda: now[0], recorder(ran), NOT_ENDED)  # type: ignore[arg-type,return-value]
    leaving()
    assert ran == [] and not records.read(cluster).grown[0].leaving  # (no warning yet)
    paths.cluster(cluster).warning("8").touch()
    leaving()
    entry = records.read(cluster).grown[0]
    assert entry.leaving == "its walltime" and entry.deadline == 85.0 and entry.drained == 1000.0
    assert len(ran) == 2 and all("--deadline-remaining-seconds=85" in a for a in ran)


def test_a_queued_job_that_no_longer_fits_says_why_and_what_to_do(cluster: str) -> None:
    from raystack.store import queue
    from raystack.store.ledger import JobRequest, read_job

    records.update(cluster, nodes_expected=2)
    big = queue.enqueue(JobRequest(id="big-1", name="big", cluster="c", entrypoint="x", needs={"nodes": 4}))
    small = queue.enqueue(
        JobRequest(id="small-1", name="small", cluster="c", entrypoint="x", needs={"nodes": 2})
    )
    ray = FakeRay()
    ray.busy = {"n-grown-1": [], "n-grown-2": []}
    records.note_grown(cluster, "8", leaving="raystack shrink", deadline=30.0)
    Leaving(cluster, lambda: ray, {}, lambda: 1000.0, recorder([]), NOT_ENDED)()  # type: ignore[arg-type]
    assert records.read(cluster).grown[0].released == 1000.0
    said = read_job(cluster, big.id).message
    assert said.startswith("waits: it needs 4 nodes and the cluster holds 2 since allocation 8 left"), said
    assert "raystack grow -N 2" in said
    assert not read_job(cluster, small.id).message.startswith("waits")


def test_a_grown_allocation_that_ended_unreleased_is_no_longer_counted(cluster: str) -> None:
    """scancel, a preemption: its Ray is gone at once (SLURM signals every process); the record
    stops counting its nodes, and a job that needs them says so. GONE is believed said twice."""

    answers = {"8": parse.answer("8", "CANCELLED", reason="None")}
    now = [1000.0]
    records.update(cluster, nodes_expected=1)
    leaving = Leaving(
        cluster, lambda: FakeRay(), {}, lambda: now[0], recorder([]), lambda b, a: answers.get(a)
    )  # type: ignore[arg-type,return-value]
    assert records.read(cluster).nodes_held == 3
    leaving()
    entry = records.read(cluster).grown[0]
    assert entry.released == 1000.0 and entry.leaving == "it ended: CANCELLED"
    assert records.read(cluster).nodes_held == 1
    records.note_grown(cluster, "9", nodes=1, hosts=["x"])
    answers["9"] = parse.gone("9")
    leaving()  # (said GONE once: not believed yet)
    assert not records.read(cluster).grown_entry("9").released  # type: ignore[union-attr]
    now[0] += 5
    leaving()  # (asked again only after CHECK_ENDED)
    assert not records.read(cluster).grown_entry("9").released  # type: ignore[union-attr]
    now[0] += 5
    leaving()
    assert records.read(cluster).grown_entry("9").released == 1010.0  # type: ignore[union-attr]


class DeadRay(FakeRay):
    """After scancel: the grown allocation's raylets are DEAD; job 03000000 had an actor on one."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes = self.nodes[:2]
        self.busy = {}
        self.used = {"03000000": {"n-mine", "n-grown-1"}, "04000000": {"n-head", "n-mine"}}

    def dead_nodes(self) -> list[NodeSummary]:
        return [
            NodeSummary("n-grown-1", "10.0.0.3", False, {}, 1000.0),  # (ended at 1000)
            NodeSummary("n-grown-2", "10.0.0.4", False, {}),
        ]

    def job_nodes(self, ray_job: str, groups: tuple[str, ...] = ()) -> set[str]:
        return self.used.get(ray_job, set())


def SOON() -> float:  # (10 s after the grown node's death)
    return 1010.0


def running_job(cluster: str, job_id: str, ray_job: str) -> None:
    from raystack.store import queue
    from raystack.store.ledger import JobRequest, read_job, update_job

    queue.enqueue(JobRequest(id=job_id, name=job_id, cluster=cluster, entrypoint="x"))
    entry = next(e for e in queue.waiting(cluster) if e.job_id == job_id)
    queue.start(cluster, entry, "7")
    attempts = read_job(cluster, job_id).attempts
    update_job(cluster, job_id, attempts=[attempts[-1].model_copy(update={"ray_job_id": ray_job})])


def test_work_lost_with_an_allocation_that_ended_unannounced_is_found(cluster: str) -> None:
    """scancel or preemption: no drain came first. A job with an actor on one of its dead nodes
    lost its work with it; one whose work was on the head's nodes did not."""
    from raystack.allocation.elastic.leaving import lost_with

    record, ray = records.read(cluster), DeadRay()
    found = lost_with(record, ray, "03000000", lambda b, a: parse.answer(a, "CANCELLED"), SOON)  # type: ignore[arg-type]
    assert found is not None and found.grown.alloc_id == "8" and found.how == "it ended: CANCELLED"
    assert found.why == "allocation 8 left the cluster under it (it ended: CANCELLED)"
    assert lost_with(record, ray, "04000000", lambda b, a: parse.answer(a, "CANCELLED"), SOON) is None  # type: ignore[arg-type]
    # (issue 68) its node died while the allocation runs on: lost with it, the allocation kept
    died = lost_with(record, ray, "03000000", lambda b, a: parse.answer(a, "RUNNING"), SOON)  # type: ignore[arg-type]
    assert died is not None and died.why == "node c died under it" and not died.left
    requeued = lost_with(record, ray, "03000000", lambda b, a: parse.answer(a, "PENDING"), SOON)  # type: ignore[arg-type]
    assert requeued is not None and requeued.how == "it is PENDING"  # (preempted and requeued)
    # A node that left long before the job failed (a shrink that found no work of it there then):
    # the failure is the job's own.
    late = lost_with(record, ray, "03000000", lambda b, a: parse.answer(a, "CANCELLED"), lambda: 1121.0)  # type: ignore[arg-type]
    assert late is None


def test_a_job_on_an_allocation_that_ended_unreleased_is_evicted(cluster: str) -> None:
    """The head finds the ended allocation before the job fails (a job blocked in a collective may
    never fail by itself): the job with work there is stopped and put back; the other is not."""
    from raystack.store.ledger import read_job

    running_job(cluster, "lost-1", "03000000")
    running_job(cluster, "safe-1", "04000000")
    answers = {"8": parse.answer("8", "CANCELLED", reason="None")}
    Leaving(cluster, lambda: DeadRay(), {}, lambda: 1000.0, recorder([]), lambda b, a: answers.get(a))()  # type: ignore[arg-type,return-value]
    assert records.read(cluster).grown[0].released == 1000.0
    assert (
        read_job(cluster, "lost-1").evicted == "allocation 8 left the cluster under it (it ended: CANCELLED)"
    )
    assert read_job(cluster, "safe-1").evicted is None


class DeadWorker(DeadRay):
    """A worker node of the main allocation died (b, 10.0.0.2) 10 s ago; job 05000000's ranks ran
    there through the launch host's placement group (named, made by another Ray job)."""

    def dead_nodes(self) -> list[NodeSummary]:
        return [NodeSummary("n-mine", "10.0.0.2", False, {}, time.time() - 10)]

    def job_nodes(self, ray_job: str, groups: tuple[str, ...] = ()) -> set[str]:
        return {"n-head", "n-mine"} if "raystack-spmd-lost-2" in groups else {"n-head"}


def test_a_job_whose_node_died_goes_back_to_the_queue_a_few_times_then_fails(cluster: str) -> None:
    """Issue 68: a node of the main allocation died under an SPMD job (its ranks in the launch
    host's group): the job is evicted (the runner puts it back as INTERRUPTED); after
    MOST_NODE_LOSSES such losses it FAILS as its own. A job without work there is not touched."""
    from raystack.allocation.runner.retry import MOST_NODE_LOSSES, lost
    from raystack.store.ledger import JobState, read_job, update_job

    running_job(cluster, "lost-2", "05000000")
    record = read_job(cluster, "lost-2")
    ray = DeadWorker()
    found = lost(cluster, ray, record, "05000000")  # type: ignore[arg-type]
    assert found.evicted == "node b died under it"
    running_job(cluster, "safe-2", "06000000")
    assert lost(cluster, ray, read_job(cluster, "safe-2"), "06000000").evicted is None  # type: ignore[arg-type]
    history = [{"state": "INTERRUPTED", "time": 1.0, "message": "stopped: node b died under it"}]
    update_job(cluster, "lost-2", evicted=None, history=history * MOST_NODE_LOSSES, state=JobState.RUNNING)
    assert lost(cluster, ray, read_job(cluster, "lost-2"), "05000000").evicted is None  # type: ignore[arg-type]


def test_a_node_whose_raylet_stops_answering_is_lost_before_ray_marks_it_dead(
    cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Testbed: a job with an actor on a SIGKILLed node failed within a second ('actor temporarily
    unavailable: Socket closed'), 15-30 s before Ray marked the node DEAD. A node that Ray still
    lists alive, whose raylet port (named by its node program) takes no connection, is lost; one
    that answers is not, and no node is asked about when the job had no work there."""
    from raystack.allocation.elastic import leaving

    entry = {"ip": "10.0.0.2", "alloc_id": "7", "raylet_port": 4321}
    node_entries.write_node_entry(cluster, "b", entry)
    asked: list[tuple[str, int]] = []
    answering = {"10.0.0.2": False}
    monkeypatch.setattr(leaving, "answers", lambda ip, port: asked.append((ip, port)) or answering[ip])

    class Alive(FakeRay):
        def dead_nodes(self) -> list[NodeSummary]:
            return []

        def job_nodes(self, ray_job: str, groups: tuple[str, ...] = ()) -> set[str]:
            return {"n-head", "n-mine"} if ray_job == "07000000" else set()

    record, ray = records.read(cluster), Alive()
    found = leaving.lost_with(record, ray, "07000000")  # type: ignore[arg-type]
    assert found is not None and found.why == "node b died under it" and asked == [("10.0.0.2", 4321)]
    answering["10.0.0.2"] = True
    assert leaving.lost_with(record, ray, "07000000") is None  # type: ignore[arg-type]
    asked.clear()
    assert leaving.lost_with(record, ray, "08000000") is None and asked == []  # type: ignore[arg-type]


def test_a_node_ray_names_in_the_jobs_log_counts_where_its_state_api_forgot_the_work(cluster: str) -> None:
    """Soak: an actor on a SIGKILLed node; by the job's end Ray had marked the node DEAD and its
    State API no longer placed the actor there; the job's log said `The actor died because its
    node has died. Node Id: <id>`. That id counts as a node of the job."""
    from raystack.allocation.runner.retry import lost
    from raystack.store import paths
    from raystack.store.ledger import read_job

    node = "ab" * 28
    ray = DeadWorker()
    ray.dead_nodes = lambda: [NodeSummary(node, "10.0.0.2", False, {}, time.time() - 5)]  # type: ignore[method-assign]
    running_job(cluster, "named-1", "09000000")
    log_file = paths.cluster(cluster).job_log("named-1")
    log_file.write_text(f"ActorDiedError: The actor died because its node has died. Node Id: {node}\n")
    assert lost(cluster, ray, read_job(cluster, "named-1"), "09000000").evicted == "node b died under it"  # type: ignore[arg-type]
    running_job(cluster, "named-2", "09000001")
    assert lost(cluster, ray, read_job(cluster, "named-2"), "09000001").evicted is None  # type: ignore[arg-type]
