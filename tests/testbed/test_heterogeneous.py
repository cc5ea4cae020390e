"""The heterogeneous cluster (issue 44): a head without GPUs (a CPU partition's node) with GPU
nodes grown beside it. Jobs count the GPU nodes: a torchrun job's ranks and a packed job's GPU
actors land there, the drivers on the head; the grown allocation never shares the head's host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raystack import Cluster
from raystack.store import cluster as clusters
from raystack.store.ledger import JobState

from ..conftest import NODES
from .test_cluster import raystack
from .test_spmd import DEBUG, lines

pytestmark = [pytest.mark.testbed, pytest.mark.ray]
PROFILE = ["--profile", "testbed", "--time", "10"]


def test_gpu_nodes_grown_beside_a_head_without_gpus_take_the_work(rs_home: Path) -> None:
    if NODES < 3:
        pytest.skip("needs 3 testbed nodes")
    up = raystack("up", "--nodes", "1", *PROFILE, "--gpus-per-node", "0", "--name", "het")
    assert up.returncode == 0, up.stderr
    cluster = Cluster("het")
    try:
        refused = raystack("submit", "-c", "het", "--set", "needs.gpus=4", "--", "python", "-c", "1")
        assert refused.returncode != 0 and "needs.gpus=4" in refused.stderr, refused.stderr
        grew = raystack("grow", "het", "-N", "2", *PROFILE, "--gpus-per-node", "4", "--timeout", "180")
        assert grew.returncode == 0, grew.stderr
        record = clusters.read("het")
        gpu_hosts = set(record.grown[0].hosts)
        assert len(gpu_hosts) == 2 and not gpu_hosts & set(record.nodes), (record.nodes, gpu_hosts)
        st = json.loads(raystack("status", "het", "--json").stdout)
        assert st["nodes_alive"] == 3, st
        # torchrun's default: every counted node, one process per GPU: 2 x 4 ranks on the GPU nodes.
        spmd = cluster.submit(DEBUG / "spmd.yaml", sets=["command=spmd.py --steps 1"])
        packed = cluster.submit(
            ["python", "spread.py", "--actors", "2", "--gpus", "2", "--hold", "1"],
            sets=["needs.gpus=4", f"working_dir={DEBUG}"],
        )
        assert spmd.wait(timeout=300).state is JobState.SUCCEEDED, spmd.logs()[-3000:]
        ranks = lines(spmd, "SPMD_RANK")
        assert len(ranks) == 8 and {r["host"] for r in ranks} == gpu_hosts, ranks
        assert packed.wait(timeout=120).state is JobState.SUCCEEDED, packed.logs()[-3000:]
        (spread,) = lines(packed, "SPREAD")
        assert {a["host"] for a in spread["actors"]} <= gpu_hosts, spread
    finally:
        raystack("down", "het")
