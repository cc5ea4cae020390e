"""NCCL's own log read for the interconnect it chose (adapters/nccl.py), on lines recorded on
2 x H100 and on lines quoted from NCCL's and its plugins' issue trackers (the fixture files name
their source): NVLink/P2P and SHM within a node, IB, OFI (libfabric: EFA, Slingshot's cxi) and TCP
sockets between nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from raystack.adapters import nccl

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def lines(name: str) -> list[str]:
    return (NCCL / name).read_text().splitlines()


def two_nodes(per_node: int) -> dict[int, str]:
    return {r: f"node{r // per_node}" for r in range(2 * per_node)}


@pytest.mark.parametrize(
    ("name", "hosts", "within", "between"),
    [
        ("p2p-h100x2-recorded.log", {0: "vm", 1: "vm"}, {"NVLink/P2P"}, set()),
        ("ib-nccl-tests-133.log", two_nodes(8), {"NVLink/P2P"}, {"IB"}),
        ("ibext-deepep-106.log", two_nodes(8), set(), {"IB"}),
        ("socket-nccl-1232.log", {0: "node0", 1: "node2", 2: "node0", 3: "node2"}, {"SHM"}, {"Socket"}),
        ("ofi-efa-aws-ofi-nccl-715.log", two_nodes(8), {"NVLink/P2P"}, {"OFI"}),
    ],
)
def test_the_transport_of_every_connection(name: str, hosts: dict, within: set, between: set) -> None:
    seen = nccl.parse(lines(name), hosts)
    assert (seen.within, seen.between) == (within, between) and seen.pairs > 0


def test_the_network_plugin_and_the_libfabric_provider() -> None:
    seen = nccl.parse(lines("ofi-cxi-aws-ofi-nccl-801.log"), {})
    assert (seen.network, seen.provider) == ("AWS Libfabric", "cxi")
    assert nccl.parse(lines("p2p-h100x2-recorded.log"), {}).network == "Socket"  # (chosen, unused: one node)


def test_sockets_where_the_profile_expects_a_fabric_is_a_problem_named_with_the_fix() -> None:
    sockets = nccl.parse(lines("socket-nccl-1232.log"), {0: "node0", 1: "node2", 2: "node0", 3: "node2"})
    why = nccl.fabric_problem(sockets, "ofi", nodes=2)
    assert why is not None and why.startswith("NCCL used Socket between nodes where the profile expects OFI")
    assert "NCCL_SOCKET_IFNAME" in why and "FI_PROVIDER" in why and "LD_PRELOAD" in why
    assert "IB" in (nccl.fabric_problem(sockets, "ib", nodes=2) or "")
    ofi = nccl.parse(lines("ofi-efa-aws-ofi-nccl-715.log"), two_nodes(8))
    assert nccl.fabric_problem(ofi, "ofi", nodes=2) is None
    assert nccl.fabric_problem(sockets, None, nodes=2) is None  # (nothing expected)
    single = nccl.parse(lines("p2p-h100x2-recorded.log"), {0: "vm", 1: "vm"})
    assert nccl.fabric_problem(single, "ofi", nodes=1) is None  # (one node: nothing between nodes)


def test_transport_names() -> None:
    assert nccl.kind("P2P/direct pointer/read") == "NVLink/P2P" and nccl.kind("NET/IBext/5/GDRDMA") == "IB"
    assert nccl.kind("NET/OFI/0") == "OFI" and nccl.kind("SHM/direct/direct") == "SHM"
    assert nccl.kind("NET/Socket/3") == "Socket" and nccl.kind("Weird/1") == "Weird"


def test_the_canary_in_one_line() -> None:
    one = {"state": "ok", "gpus": 2, "nodes": 1, "busbw_gbps": 329.4, "within": ["NVLink/P2P"], "between": []}
    assert nccl.canary_words(one) == (
        "interconnect: 2 GPUs on 1 node(s), all-reduce 329.4 GB/s bus; NVLink/P2P within nodes"
    )
    two = {**one, "gpus": 8, "nodes": 2, "between": ["OFI"], "provider": "cxi", "busbw_gbps": 41.0}
    assert nccl.canary_words(two).endswith("NVLink/P2P within nodes, OFI between them (cxi)")
    warned = {**two, "between": ["Socket"], "provider": None, "warning": "NCCL used Socket ..."}
    assert nccl.canary_words(warned).endswith("Socket between them; WARNING: NCCL used Socket ...")
    assert nccl.canary_words({"state": "skipped", "why": "no GPUs"}) == "interconnect canary skipped: no GPUs"
