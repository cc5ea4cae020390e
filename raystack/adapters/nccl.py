"""What NCCL's own log (NCCL_DEBUG=INFO) says about the interconnect it chose: the transport of
each connection between two ranks, the network plugin, the libfabric provider. Pure parsing of
lines like these (tests/fixtures/nccl: recorded on 2 x H100, and quoted from NCCL's and its
plugins' issue trackers for IB, Socket and OFI between nodes):

  vm:820:820 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
  nodeb:65671:65858 [5] NCCL INFO Channel 01 : 13[92000] -> 4[89000] [send] via NET/IB/0/GDRDMA
  node0:13571:13571 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
  algo-1:18059:20782 [2] NCCL INFO Channel 04/1 : 15[7] -> 2[2] [receive] via NET/AWS Libfabric/1/GDRDMA
  [0] NCCL INFO NET/OFI Selected Provider is cxi (found 8 nics)
  [0] NCCL INFO Using network AWS Libfabric
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

CHANNEL = re.compile(
    r"NCCL INFO (?:Channel|Ring) \d+(?:/\d+)? : (\d+)(?:\[[^\]]*\])? -> (\d+)(?:\[[^\]]*\])?"
    r"(?: \[(?:send|receive)\])? via (.+?)\s*$"
)
NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
PROVIDER = re.compile(r"NCCL INFO NET/OFI Selected Provider is (\S+)")
# The transports by what NCCL's "via ..." starts with, in people's words.
KINDS = (
    ("P2P", "NVLink/P2P"),
    ("SHM", "SHM"),
    ("NVLS", "NVLS"),
    ("COLLNET", "CollNet"),
    ("NET/IB", "IB"),  # (NET/IB and the IB plugin's NET/IBext)
    ("NET/AWS LIBFABRIC", "OFI"),
    ("NET/OFI", "OFI"),
    ("NET/LIBFABRIC", "OFI"),
    ("NET/SOCKET", "Socket"),
)
FABRICS = {"ib": "IB", "ofi": "OFI", "socket": "Socket"}  # a profile's `fabric:` -> the kind expected


def kind(via: str) -> str:
    """`NET/AWS Libfabric/1/GDRDMA/Shared` -> OFI, `P2P/CUMEM/read` -> NVLink/P2P, ..."""
    upper = via.upper()
    for prefix, name in KINDS:
        if upper.startswith(prefix):
            return name
    return via.split("/")[0] or via


@dataclass
class Interconnect:
    """The transports NCCL used, between ranks on one node and between nodes."""

    within: set[str] = field(default_factory=set)  # transports between ranks of one node
    between: set[str] = field(default_factory=set)  # transports between ranks of different nodes
    network: str | None = None  # NCCL's network plugin ("IB", "Socket", "AWS Libfabric")
    provider: str | None = None  # libfabric's provider (cxi on Slingshot, efa on AWS)
    pairs: int = 0  # connections read


def parse(lines: list[str], host_of: dict[int, str]) -> Interconnect:
    """The transports in NCCL's INFO lines of a communicator whose rank r ran on host_of[r]
    (a connection between ranks whose host is unknown counts as between nodes when it is NET/)."""
    found = Interconnect()
    for line in lines:
        if m := CHANNEL.search(line):
            src, dst, name = int(m[1]), int(m[2]), kind(m[3])
            same = host_of.get(src) is not None and host_of.get(src) == host_of.get(dst)
            if not same and ((src in host_of and dst in host_of) or m[3].upper().startswith("NET/")):
                found.between.add(name)
            else:
                found.within.add(name)
            found.pairs += 1
        elif m := NETWORK.search(line):
            found.network = m[1]
        elif m := PROVIDER.search(line):
            found.provider = m[1]
    return found


def fabric_problem(seen: Interconnect, expected: str | None, nodes: int) -> str | None:
    """Why the transports between nodes are not the fabric the profile expects (None: they are,
    or nothing was expected, or one node had no traffic between nodes to judge)."""
    want = FABRICS.get((expected or "").lower())
    if want is None or nodes < 2 or not seen.between:
        return None
    if seen.between == {want}:
        return None
    got = ", ".join(sorted(seen.between))
    fix = (
        "check NCCL_SOCKET_IFNAME (the fabric's interface, e.g. hsn on Slingshot), NCCL_NET and "
        "FI_PROVIDER (cxi), that the OFI plugin's module is loaded (aws-ofi-nccl) and that "
        "LD_PRELOAD puts the system NCCL first"
        if want == "OFI"
        else "check NCCL_SOCKET_IFNAME, NCCL_IB_HCA and that the job sees the IB devices (ibv_devinfo)"
    )
    slower = " (TCP sockets ran ~17x slower than Slingshot on Isambard)" if "Socket" in seen.between else ""
    return f"NCCL used {got} between nodes where the profile expects {want}{slower}: {fix}"


def canary_words(found: dict[str, Any]) -> str:
    """The canary in one line: `interconnect: 8 GPUs on 2 nodes, all-reduce 180.2 GB/s bus;
    NVLink/P2P within nodes, OFI between them (cxi)`."""
    state = found.get("state")
    if state in ("skipped", "off", "failed"):
        return f"interconnect canary {state}" + (f": {found['why']}" if found.get("why") else "")
    gpus, nodes = found.get("gpus"), found.get("nodes")
    bw = (
        f"all-reduce {found['busbw_gbps']} GB/s bus"
        if found.get("busbw_gbps")
        else "one GPU: no all-reduce traffic"
    )
    within = f"{'/'.join(found.get('within') or []) or '-'} within nodes"
    between = (
        f", {'/'.join(found['between'])} between them"
        + (f" ({found['provider']})" if found.get("provider") else "")
        if found.get("between")
        else ", no traffic between nodes"
        if nodes and nodes > 1
        else ""
    )
    bad = f"; {state}" if state != "ok" else ""
    warn = f"; WARNING: {found['warning']}" if found.get("warning") else ""
    return f"interconnect: {gpus} GPUs on {nodes} node(s), {bw}; {within}{between}{bad}{warn}"
