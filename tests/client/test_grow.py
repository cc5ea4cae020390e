"""What a grow allocation asks by default (client/grow.py): the head's shape, unless other nodes
are named (the heterogeneous case)."""

from __future__ import annotations

from raystack.client.grow import inherited
from raystack.store.cluster import ClusterRecord

REQUEST = {"name": "raystack-c", "queue": "gpu", "account": "proj", "time": "2:00:00"}


def test_a_grow_asks_for_the_heads_shape_by_default() -> None:
    record = ClusterRecord(name="c", profile="isambard", gpus_per_node=2, cpus_per_node=32, request=REQUEST)
    assert inherited(record, {}) == {
        "profile": "isambard",
        "time": "2:00:00",
        "partition": "gpu",
        "account": "proj",
        "gpus_per_node": 2,
        "cpus_per_task": 32,
    }


def test_another_partition_or_profile_is_planned_from_its_profile() -> None:
    record = ClusterRecord(name="c", profile="generic", gpus_per_node=0, request=REQUEST)
    assert inherited(record, {"partition": "gh200"}) == {"profile": "generic", "time": "2:00:00"}
    assert inherited(record, {"profile": "isambard"}) == {"profile": "generic", "time": "2:00:00"}
