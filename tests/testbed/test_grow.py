"""Growing a cluster (issue 44): `up -N 2`, `grow -N 2` -> 4 nodes in one Ray cluster; a job that
needs 4 nodes runs across both allocations; `shrink` drains the grown nodes through Ray's GCS and
ends their allocation; a job on a grown allocation that is cancelled (or preempted) under it is
put back and reruns; `down` ends a grown allocation with the cluster."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.adapters import slurm
from raystack.client import Job
from raystack.store import cluster as clusters
from raystack.store.ledger import JobState

from ..conftest import module_home, wait_until
from .test_cluster import raystack

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
PROFILE = ["--profile", "testbed", "--time", "10"]
HOSTS = """import socket

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init()
pg = ray.util.placement_group([{"CPU": 1}] * 4, strategy="STRICT_SPREAD")
ray.get(pg.ready())
where = ray.remote(num_cpus=1)(lambda: socket.gethostname())
on = [where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote() for i in range(4)]
print(sorted(ray.get(on)))
"""
SPREAD = """import os
import socket
import time

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init()
pg = ray.util.placement_group([{"CPU": 1}] * 4, strategy="SPREAD")  # (one per node where it can)
ray.get(pg.ready())


@ray.remote(num_cpus=1)
class Part:
    def host(self):
        return socket.gethostname()

    def work(self, seconds):
        time.sleep(seconds)


parts = [Part.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote() for i in range(4)]
print("on", sorted(ray.get([p.host.remote() for p in parts])), flush=True)
# (the first run works long enough to be stopped; its rerun, RAYSTACK_RESUME=1, finishes soon)
ray.get([p.work.remote(10 if os.environ.get("RAYSTACK_RESUME") else WORK) for p in parts])
print("done")
"""


@pytest.fixture(scope="module")
def elastic(testbed: Path) -> Iterator[Cluster]:
    with module_home(testbed, "grow"):
        up = raystack("up", "--nodes", "2", *PROFILE, "--name", "elastic")
        assert up.returncode == 0, up.stderr
        yield Cluster("elastic")
        raystack("down", "elastic")


def placed(log: str) -> list[list[str]]:
    """The hosts of the spread job's actors, one list per attempt, from its `on [...]` lines."""
    return [eval(line[3:]) for line in log.splitlines() if line.startswith("on [")]


def grown_ids() -> list[str]:
    return [g.alloc_id for g in clusters.read("elastic").grown]


def spread_over_a_grow(
    elastic: Cluster, factory: pytest.TempPathFactory, work: int, *grow_args: str
) -> tuple[str, set[str], Job]:
    """Grow by 2 nodes, then start a job with an actor on every node (its first run works `work`
    seconds): the grown allocation, its hosts and the job, once its actors are placed there."""
    grew = raystack("grow", "elastic", "-N", "2", *grow_args, "--timeout", "180")
    assert grew.returncode == 0, grew.stderr
    alloc = grown_ids()[-1]
    hosts = set(clusters.read("elastic").grown_entry(alloc).hosts)  # type: ignore[union-attr]
    folder = factory.mktemp("spread")
    (folder / "spread.py").write_text(SPREAD.replace("WORK", str(work)))
    job = elastic.submit(["python", "spread.py"], sets=[f"working_dir={folder}"])
    wait_until(lambda: placed(job.logs()), 120, "the job's actors on every node")
    assert hosts <= set(placed(job.logs())[0]), placed(job.logs())
    return alloc, hosts, job


def test_grow_joins_a_second_allocation_and_a_four_node_job_spans_both(
    elastic: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # (before: a job that needs 4 nodes is refused, with the fix)
    refused = raystack("submit", "-c", "elastic", "--nodes", "4", "--", "python", "-c", "print(1)")
    assert refused.returncode != 0 and "needs.nodes=4" in refused.stderr, refused.stderr
    grew = raystack("grow", "elastic", "-N", "2", *PROFILE, "--timeout", "180")
    assert grew.returncode == 0, grew.stderr
    (alloc,) = grown_ids()
    assert alloc != clusters.read("elastic").allocation_id
    info = slurm.job_info(alloc)
    assert info is not None and info.name == "raystack-elastic-grow" and info.node_count == 2
    st = json.loads(raystack("status", "elastic", "--json").stdout)
    assert (st["nodes_alive"], st["nodes_expected"], st["ready"]) == (4, 4, True), st
    assert st["grown"][0]["allocation_id"] == alloc and st["grown"][0]["state"] == "joined"
    assert f"grown         {alloc} joined: 2 node(s)" in raystack("status", "elastic").stdout
    # A job of 4 nodes x 1 task: its tasks land on both allocations' nodes.
    folder = tmp_path_factory.mktemp("hosts")
    (folder / "hosts.py").write_text(HOSTS)
    job = elastic.submit(["python", "hosts.py"], sets=["needs.nodes=4", f"working_dir={folder}"])
    job.wait(timeout=240)
    assert job.record().state is JobState.SUCCEEDED, job.logs()
    hosts = eval(next(line for line in job.logs().splitlines() if line.startswith("['")))
    assert len(set(hosts)) == 4 and set(clusters.read("elastic").grown[0].hosts) <= set(hosts), hosts


def test_shrink_drains_the_grown_nodes_and_ends_their_allocation(
    elastic: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    (alloc,) = grown_ids()
    grown_hosts = set(clusters.read("elastic").grown[0].hosts)
    folder = tmp_path_factory.mktemp("spread")
    (folder / "spread.py").write_text(SPREAD.replace("WORK", "60"))
    job = elastic.submit(["python", "spread.py"], sets=[f"working_dir={folder}"])
    wait_until(lambda: placed(job.logs()), 120, "the job's actors on every node")
    first = placed(job.logs())[0]
    assert grown_hosts <= set(first), first  # (its first attempt has actors on the grown nodes)
    shrunk = raystack("shrink", alloc, "-c", "elastic", "--deadline", "60s", "--timeout", "180")
    assert shrunk.returncode == 0, shrunk.stderr
    # The job was stopped before its nodes left, put back in the queue, and ran again on the nodes
    # that remain: nothing lost, nothing run twice at once.
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED and record.interruptions == 1, (record.message, job.logs())
    assert any(
        h.get("state") == "INTERRUPTED" and "leaves the cluster" in h["message"] for h in record.history
    )
    last = placed(job.logs())[-1]
    assert not grown_hosts & set(last), last
    entry = clusters.read("elastic").grown_entry(alloc)
    assert entry is not None and entry.drained and entry.released and entry.drained <= entry.released
    wait_until(lambda: (i := slurm.job_info(alloc)) is not None and i.state.is_terminal(), 60, "it to end")
    st = json.loads(raystack("status", "elastic", "--json").stdout)
    assert (st["nodes_alive"], st["nodes_expected"], st["ready"]) == (2, 2, True), st


def test_a_grown_allocation_at_its_walltime_is_drained_and_its_job_reruns(
    elastic: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """SLURM's walltime warning reaches the grown allocation's script (a quarter of its 3 minutes
    before the end): its nodes are drained before they go, and the job on them starts again."""
    alloc, grown_hosts, job = spread_over_a_grow(elastic, tmp_path_factory, 150, "-P", "testbed", "-t", "3")
    entry = wait_until(
        lambda: (g := clusters.read("elastic").grown_entry(alloc)) and g.released and g, 200, "its release"
    )
    assert entry.leaving == "its walltime" and entry.drained is not None
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED and record.interruptions == 1, (record.message, job.logs())
    assert not grown_hosts & set(placed(job.logs())[-1])


def test_a_cancelled_grown_allocation_s_job_is_put_back_and_reruns(
    elastic: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """scancel (or a preemption) ends every process of the grown allocation at once: no drain
    comes first, so the job with actors there fails. It is put back in the queue, not FAILED, and
    finishes on the nodes that remain; the allocation's nodes are no longer counted."""
    alloc, grown_hosts, job = spread_over_a_grow(elastic, tmp_path_factory, 120, *PROFILE)
    subprocess.run(["scancel", alloc], check=True)  # (as a user or an administrator would)
    record = job.wait(timeout=180)
    assert record.state is JobState.SUCCEEDED and record.interruptions == 1, (record.message, job.logs())
    assert any(
        h.get("state") == "INTERRUPTED" and f"allocation {alloc} left the cluster under it" in h["message"]
        for h in record.history
    ), record.history
    assert not grown_hosts & set(placed(job.logs())[-1])
    entry = wait_until(
        lambda: (g := clusters.read("elastic").grown_entry(alloc)) and g.released and g, 60, "its release"
    )
    assert str(entry.leaving) in ("it is COMPLETING", "it ended: CANCELLED"), entry  # (SLURM's words)
    assert clusters.read("elastic").nodes_held == 2


def test_down_ends_a_grown_allocation_with_the_cluster(elastic: Cluster) -> None:
    grew = raystack("grow", "elastic", "-N", "1", *PROFILE, "--no-wait")
    assert grew.returncode == 0, grew.stderr
    alloc = grown_ids()[-1]
    down = raystack("down", "elastic")
    assert down.returncode == 0, down.stderr
    wait_until(lambda: (i := slurm.job_info(alloc)) is not None and i.state.is_terminal(), 60, "it to end")
