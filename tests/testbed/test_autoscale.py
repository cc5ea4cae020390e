"""The queue asks for nodes (issue 44): `up -N 1 --max-nodes 4` with three 1-node jobs queued
grows the cluster to run them side by side, and shrinks back once the grown nodes idle."""

from __future__ import annotations

import json
import re
import time
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
JOB_S = 30  # (3 of them one after another: 90 s; side by side, with a grow of about 20 s: about 50 s)


@pytest.fixture(scope="module")
def auto(testbed: Path) -> Iterator[Cluster]:
    with module_home(testbed, "auto"):
        up = raystack(
            *("up", "--nodes", "1", "--max-nodes", "4", "--idle-timeout", "20s"),
            *("--profile", "testbed", "--time", "10", "--name", "auto"),
        )
        assert up.returncode == 0, up.stderr
        yield Cluster("auto")
        raystack("down", "auto")


def test_the_queue_grows_the_cluster_and_it_shrinks_back_when_idle(auto: Cluster) -> None:
    assert "up to 4 nodes" in raystack("status", "auto").stdout
    t0 = time.time()
    code = f"import socket, time; time.sleep({JOB_S}); print(socket.gethostname())"
    jobs = [auto.submit(["python", "-c", code], sets=["needs.nodes=1"]) for _ in range(3)]
    wait_until(lambda: clusters.read("auto").grown, 30, "the queue to ask for nodes")
    (grown,) = clusters.read("auto").grown
    assert grown.auto and grown.nodes == 2, grown  # (1 running + 2 waiting - 1 held)
    records = [job.wait(timeout=240) for job in jobs]
    makespan = time.time() - t0
    assert all(r.state is JobState.SUCCEEDED for r in records), [r.message for r in records]
    hosts = {job.logs().strip().splitlines()[-1] for job in jobs}
    assert len(hosts) == 3, hosts  # (side by side, each on a node of its own)
    assert makespan < 3 * JOB_S, makespan  # (one after another on 1 node would take 3 x JOB_S)
    # Idle for idle_timeout: drained and released, the allocation ended; the cluster runs on.
    wait_until(lambda: clusters.read("auto").grown[0].released, 120, "the idle grown nodes to be released")
    wait_until(
        lambda: (i := slurm.job_info(grown.alloc_id)) is not None and i.state.is_terminal(), 60, "its end"
    )
    st = json.loads(raystack("status", "auto", "--json").stdout)
    assert st["nodes_expected"] == 1 and st["grown"] is None, st


def test_an_spmd_job_of_more_nodes_than_held_grows_the_cluster_and_ranks_on_each(auto: Cluster) -> None:
    """Issue 66: on `up -N 1 --max-nodes 3` a `kind: spmd` job with `nodes: 3` FAILED at once
    (`3 nodes x 1 processes do not fit 1 nodes x 4 GPUs`); `needs.nodes: 3` grew the cluster. An
    SPMD job's nodes are a demand the queue grows for, as needs.nodes is; it runs when they joined."""
    wait_until(lambda: not [g for g in clusters.read("auto").grown if not g.released], 180, "the shrink")
    assert clusters.read("auto").nodes_held == 1
    before = len(clusters.read("auto").grown)
    debug = Path(__file__).resolve().parents[2] / "jobs" / "debug" / "spmd.yaml"
    job = auto.submit(debug, sets=["nodes=3", "procs_per_node=1"])
    assert job.record().request.needs == {"nodes": 3}
    record = job.wait(timeout=240)
    assert record.state is JobState.SUCCEEDED, record.message
    hosts = set(re.findall(r"raystack spmd: node \d \((\S+)\)", job.logs()))
    assert len(hosts) == 3, job.logs()[-2000:]
    grown = clusters.read("auto").grown[before:]
    assert [g.nodes for g in grown] == [2] and grown[0].auto, grown  # (the 2 nodes it lacked)
