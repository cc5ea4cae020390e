"""What a job's driver asks (entrypoint_memory) against what a node of the cluster gives Ray:
refused before it is queued."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.errors import ConfigError
from raystack.spec.job import command_spec
from raystack.spec.resolve import resolve
from raystack.store.cluster import ClusterRecord

CLUSTER = ClusterRecord(name="c", nodes_expected=1, gpus_per_node=0, cpus_per_node=4)


def test_a_driver_asking_more_memory_than_a_node_gives_ray_is_refused_at_submit(tmp_path: Path) -> None:
    """--entrypoint-memory 1000G on nodes whose Ray memory is 90 GiB: refused before queueing (as
    --entrypoint-num-cpus 1e9 is), not FAILED 70 s later; what fits, or an unknown size, passes."""
    big = CLUSTER.model_copy(update={"memory_per_node": 90 * 2**30})
    spec = command_spec(["python", "x.py"], sets=["entrypoint_memory=1000G"])
    with pytest.raises(
        ConfigError, match=r"entrypoint_memory=1000.0 GiB but a node of .* gives Ray 90.0 GiB"
    ):
        resolve(spec, big, tmp_path, "command")
    fits = command_spec(["python", "x.py"], sets=["entrypoint_memory=8G"])
    assert resolve(fits, big, tmp_path, "command").entrypoint_memory == 8 * 2**30
    assert resolve(spec, CLUSTER, tmp_path, "command").entrypoint_memory == 1000 * 2**30  # (size unknown)
