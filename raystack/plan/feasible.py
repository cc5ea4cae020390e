"""Whether a running job's pending demand (an actor, a task, a placement group) can ever be
placed on the cluster's nodes as they are. Pure functions: the queue runner feeds them what
Ray's State API lists as pending for the job (adapters/ray.py `pending_demands`).

Only a demand that certainly cannot fit is called infeasible: a resource dict that no single
node holds, a placement group with a bundle that fits no node, more than the whole cluster, a
STRICT_PACK group no node holds, or one Ray's own scheduler marked INFEASIBLE. A demand that
waits for resources other jobs hold is not infeasible: it waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

Resources = Mapping[str, float]
SHOWN = ("GPU", "CPU")  # always shown for a node, beside what the demand asks for


@dataclass(frozen=True)
class Demand:
    """One pending request of a job: `bundles` is one dict for an actor or a task."""

    kind: str  # "actor", "task", "placement group"
    name: str
    bundles: list[dict[str, float]]
    strategy: str = ""  # placement groups: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD (if known)
    ray_says_infeasible: bool = False  # Ray's scheduler marked it INFEASIBLE
    extra: dict[str, str] = field(default_factory=dict)


def _asked(bundle: Resources) -> dict[str, float]:
    """The resources that constrain placement (Ray's internal per-node and group keys aside)."""
    return {
        k: float(v)
        for k, v in bundle.items()
        if v and not k.startswith("node:") and "_group_" not in k and k != "bundle"
    }


def fits(bundle: Resources, node: Resources) -> bool:
    return all(node.get(k, 0.0) >= v - 1e-9 for k, v in _asked(bundle).items())


def fmt(resources: Resources, keys: list[str] | None = None) -> str:
    """{GPU: 4, CPU: 16}: the keys asked for (GPU and CPU first), numbers without '.0'."""
    order = keys or [k for k in SHOWN if k in resources] + sorted(k for k in resources if k not in SHOWN)
    parts = [f"{k}: {_amount(k, resources.get(k, 0))}" for k in order]
    return "{" + ", ".join(parts) + "}"


def _amount(key: str, value: float) -> str:
    """A resource's amount: memory in GiB or TiB (Ray counts it in bytes), the rest as numbers."""
    if key not in ("memory", "object_store_memory"):
        return f"{value:g}"
    gib = value / 2**30
    return f"{gib:.3g}GiB" if gib < 1000 else f"{gib / 1024:.3g}TiB"


def _largest(nodes: Sequence[Resources], bundle: Resources) -> Resources:
    """The node closest to holding `bundle`: the most of the first resource it lacks everywhere."""
    asked = _asked(bundle)
    lacking = next((k for k in asked if all(n.get(k, 0.0) < asked[k] for n in nodes)), None)
    key = lacking or next(iter(asked), "CPU")
    return max(nodes, key=lambda n: (n.get(key, 0.0), n.get("GPU", 0.0), n.get("CPU", 0.0)))


def _node_text(node: Resources, bundle: Resources) -> str:
    keys = [k for k in SHOWN if k in node or k in bundle] + [k for k in _asked(bundle) if k not in SHOWN]
    return fmt(node, list(dict.fromkeys(keys)))


def why_infeasible(demand: Demand, nodes: Sequence[Resources]) -> str | None:
    """Why `demand` can never be placed on `nodes` (their total resources), or None if it can."""
    label = f"{demand.kind} {demand.name}"
    if not nodes:
        return None  # (no node alive: the cluster is restarting, not the job's fault)
    bundles = [_asked(b) for b in demand.bundles]
    for bundle in bundles:
        if not any(fits(bundle, n) for n in nodes):
            node = _largest(nodes, bundle)
            which = "the largest node" if len(nodes) > 1 else "the node"
            return f"{label} wants {fmt(bundle)}; {which} has {_node_text(node, bundle)}"
    if demand.kind != "placement group":
        return None
    total: dict[str, float] = {}
    for bundle in bundles:
        for k, v in bundle.items():
            total[k] = total.get(k, 0.0) + v
    have = {k: sum(n.get(k, 0.0) for n in nodes) for k in total}
    if any(have[k] < v - 1e-9 for k, v in total.items()):
        return f"{label} wants {fmt(total)} in all; the {len(nodes)} nodes have {fmt(have)}"
    if demand.strategy == "STRICT_PACK" and not any(fits(total, n) for n in nodes):
        biggest = _node_text(_largest(nodes, total), total)
        return f"{label} (STRICT_PACK) wants {fmt(total)} on one node; the largest has {biggest}"
    if demand.strategy == "STRICT_SPREAD" and not _spread_fits(bundles, nodes):
        return (
            f"{label} (STRICT_SPREAD) wants {len(bundles)} bundles on as many different nodes; "
            f"the cluster has {len(nodes)} nodes"
        )
    if demand.ray_says_infeasible:
        shapes = ", ".join(fmt(b) for b in bundles[:4]) + (" ..." if len(bundles) > 4 else "")
        how = f" ({demand.strategy})" if demand.strategy else ""
        return (
            f"{label}{how} of {len(bundles)} bundles [{shapes}] cannot be placed on the "
            f"{len(nodes)} nodes (Ray: INFEASIBLE)"
        )
    return None


def _spread_fits(bundles: list[dict[str, float]], nodes: Sequence[Resources]) -> bool:
    """Each bundle on its own node: a matching of bundles to nodes (augmenting paths)."""
    owner: dict[int, int] = {}

    def place(b: int, seen: set[int]) -> bool:
        for n, node in enumerate(nodes):
            if n in seen or not fits(bundles[b], node):
                continue
            seen.add(n)
            if n not in owner or place(owner[n], seen):
                owner[n] = b
                return True
        return False

    return len(bundles) <= len(nodes) and all(place(b, set()) for b in range(len(bundles)))
