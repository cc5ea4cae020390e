"""The interconnect canary's verdict at READY (allocation/head/canary.py): what the profile expects of
the fabric against what NCCL used; the all-reduce itself runs on the GPU machine (tests/gpu)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.allocation.head import canary
from raystack.allocation.node.context import NodeContext
from raystack.errors import RaystackError

SOCKETS = {
    "state": "ok",
    "gpus": 8,
    "nodes": 2,
    "busbw_gbps": 2.1,
    "within": ["NVLink/P2P"],
    "between": ["Socket"],
}


def ctx(gpus: int) -> NodeContext:
    where = {"cluster": "c", "alloc_id": "1", "node_id": 0, "num_nodes": 2, "host": "n1", "ip": "10.0.0.1"}
    return NodeContext(
        **where, gpus=gpus, cpus=8, temp_dir=Path("/tmp/x"), object_store_bytes=1, join_timeout=60
    )


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list:
    calls: list = []
    monkeypatch.setattr(canary, "real_gpus", lambda: True)
    monkeypatch.setattr(canary, "_run_driver", lambda c, beat: calls.append(c) or dict(SOCKETS))
    return calls


def test_sockets_between_nodes_where_the_profile_expects_ofi_warn_or_refuse(ran: list) -> None:
    found = canary.at_ready(ctx(4), lambda: None, {"RAYSTACK_FABRIC": "ofi"})
    assert found["warning"].startswith("NCCL used Socket between nodes where the profile expects OFI")
    with pytest.raises(RaystackError, match=r"canary: strict.*NCCL used Socket.*not started"):
        canary.at_ready(ctx(4), lambda: None, {"RAYSTACK_FABRIC": "ofi", "RAYSTACK_CANARY": "strict"})
    assert "warning" not in canary.at_ready(ctx(4), lambda: None, {})  # (no fabric expected)


def test_off_or_no_gpus_skip_it_and_say_why(ran: list, monkeypatch: pytest.MonkeyPatch) -> None:
    assert canary.at_ready(ctx(4), lambda: None, {"RAYSTACK_CANARY": "off"})["state"] == "off"
    assert canary.at_ready(ctx(0), lambda: None, {})["why"].startswith("no GPUs in the allocation")
    monkeypatch.setattr(canary, "real_gpus", lambda: False)
    assert (
        canary.at_ready(ctx(4), lambda: None, {})["why"]
        == "no NVIDIA driver on the head (nvidia-smi not found)"
    )
    assert ran == []  # (nothing was started for any of them)
