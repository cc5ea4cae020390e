"""Growing a cluster (issue 44): `up -N 2`, `grow -N 2` -> 4 nodes in one Ray cluster; a job that
needs 4 nodes runs across both allocations; `shrink` drains the grown nodes through Ray's GCS and
ends their allocation; `down` ends a grown allocation with the cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.adapters import slurm
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


@pytest.fixture(scope="module")
def elastic(testbed: Path) -> Iterator[Cluster]:
    with module_home(testbed, "grow"):
        up = raystack("up", "--nodes", "2", *PROFILE, "--name", "elastic")
        assert up.returncode == 0, up.stderr
        yield Cluster("elastic")
        raystack("down", "elastic")


def grown_ids() -> list[str]:
    return [g.alloc_id for g in clusters.read("elastic").grown]


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


def test_shrink_drains_the_grown_nodes_and_ends_their_allocation(elastic: Cluster) -> None:
    (alloc,) = grown_ids()
    shrunk = raystack("shrink", alloc, "-c", "elastic", "--deadline", "20s", "--timeout", "120")
    assert shrunk.returncode == 0, shrunk.stderr
    entry = clusters.read("elastic").grown_entry(alloc)
    assert entry is not None and entry.drained and entry.released and entry.drained <= entry.released
    wait_until(lambda: (i := slurm.job_info(alloc)) is not None and i.state.is_terminal(), 60, "it to end")
    st = json.loads(raystack("status", "elastic", "--json").stdout)
    assert (st["nodes_alive"], st["nodes_expected"], st["ready"]) == (2, 2, True), st
    # The cluster runs on, on its own allocation: a job still runs.
    job = elastic.submit(["python", "-c", "print('still here')"])
    job.wait(timeout=120)
    assert job.record().state is JobState.SUCCEEDED


def test_down_ends_a_grown_allocation_with_the_cluster(elastic: Cluster) -> None:
    grew = raystack("grow", "elastic", "-N", "1", *PROFILE, "--no-wait")
    assert grew.returncode == 0, grew.stderr
    alloc = grown_ids()[-1]
    down = raystack("down", "elastic")
    assert down.returncode == 0, down.stderr
    wait_until(lambda: (i := slurm.job_info(alloc)) is not None and i.state.is_terminal(), 60, "it to end")
