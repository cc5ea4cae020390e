"""Growing a running cluster with further allocations, and shrinking it again.

`grow` submits an allocation of the cluster's own script with RAYSTACK_GROW=1: every node of it
runs the node program as a Ray worker of the cluster (its token, its TLS, its session), joining
whichever head runs the cluster. It may ask another partition or node shape. `shrink` marks one
leaving: the head drains its Ray nodes through Ray's GCS (nothing new lands there), releases them
once no actor or task runs there (or at the drain deadline), and the allocation is ended. `down`
ends grown allocations with the cluster.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from raystack.adapters.allocator import Script, allocator, asked
from raystack.client import allocate
from raystack.client.access import live_dashboard
from raystack.client.reconcile import settle
from raystack.errors import ClusterError, ConfigError
from raystack.store import cluster as records
from raystack.store import node_entries, paths
from raystack.store.cluster import GROW_VAR, ClusterRecord, ClusterState, Grown
from raystack.store.files import atomic_write
from raystack.waiting import REAL, Clock, until


def grow(name: str, nodes: int, auto: bool = False, **options: Any) -> Grown:
    """Submit a further allocation of `nodes` workers for a READY cluster; its record entry.
    `options`: those of allocate.plan (profile, time, partition, account, gpus_per_node, ...);
    `auto`: the queue asked for it (`up --max-nodes`), released when idle."""
    record = settle(records.read(name))
    if record.state is not ClusterState.READY:
        raise ClusterError(
            f"cluster {name} is {record.state.value}: grow a READY cluster (`raystack wait {name}`)"
        )
    backend = allocator(record.backend)
    if not backend.remote:
        raise ConfigError(
            f"grow: cluster {name} runs on this machine (up --local): it has no scheduler to ask"
        )
    options = {**inherited(record, options), **{k: v for k, v in options.items() if v is not None}}
    planned = allocate.plan_on_partition(nodes, name=name, chain=1, **options)
    env = {**planned.env, GROW_VAR: "1", "RAYSTACK_TLS": "1" if record.tls else "0"}
    planned = replace(planned, env=env, backend=record.backend)
    index = len(record.grown) + 1
    script = paths.cluster(name).root / f"grow-{index}.sbatch"
    # (never a host the cluster holds: one Ray node per host, and a head that leaves room on its
    # node, a CPU head, would otherwise share it with the GPU workers grown beside it)
    hosts = [*record.nodes, *(h for g in record.grown if not g.released for h in g.hosts)]
    request = replace(planned.request(), name=f"raystack-{name}-grow", exclude=tuple(dict.fromkeys(hosts)))
    text = backend.render(
        Script(request, allocate.environment(planned), planned.profile.name, planned.note, script)
    )
    atomic_write(script, text, mode=0o700)
    alloc_id = backend.submit(script, request)
    entry = records.note_grown(
        name,
        alloc_id,
        nodes=nodes,
        gpus_per_node=planned.gpus_per_node,
        cpus_per_node=planned.cpus_per_task or 0,
        queue=planned.partition,
        auto=auto,
    )
    assert entry is not None
    if records.read(name).state.is_terminal():  # (`down` came meanwhile)
        backend.cancel(alloc_id)
        raise ClusterError(f"cluster {name} ended meanwhile: {backend.place(alloc_id)} cancelled")
    return entry


def inherited(record: ClusterRecord, options: dict[str, Any]) -> dict[str, Any]:
    """What a grow allocation asks by default: the cluster's profile and walltime, and, unless
    another profile or partition is named (other nodes: the heterogeneous case), the head
    allocation's partition, account and node shape."""
    asked_for = asked(record)
    out: dict[str, Any] = {"profile": record.profile, "time": asked_for.time if asked_for else None}
    if options.get("profile") or options.get("partition") or asked_for is None:
        return out
    return {
        **out,
        "partition": asked_for.queue,
        "account": asked_for.account,
        "gpus_per_node": record.gpus_per_node,
        "cpus_per_task": record.cpus_per_node or None,
    }


def joined(name: str, alloc_id: str, timeout: float | None = None, clock: Clock = REAL) -> Grown:
    """Wait until every node of grown allocation `alloc_id` runs in the cluster's Ray."""
    record = records.read(name)
    backend = allocator(record.backend)
    seen: list[str] = [""]

    def step() -> Grown | None:
        current = records.read(name)
        entry = current.grown_entry(alloc_id)
        if entry is None or current.state.is_terminal():
            raise ClusterError(f"cluster {name} ended before allocation {alloc_id} joined")
        info = backend.info(alloc_id)
        if info is not None and info.state.is_terminal():
            raise ClusterError(
                f"{backend.place(alloc_id)} ended ({info.state_text}, {info.reason or 'no reason given'}) "
                f"before its nodes joined; its log: {paths.cluster(name).allocation_log(alloc_id)}"
            )
        if not entry.hosts:
            seen[0] = f"{backend.place(alloc_id)} {info.state_text if info else '?'}" + (
                f" ({info.reason})" if info and info.reason and info.reason != "None" else ""
            )
            return None
        alive = {n.ip for n in live_dashboard(current, None).alive_nodes(timeout=5)}
        return entry if len(node_entries.allocation_ips(name, alloc_id) & alive) >= entry.nodes else None

    def late() -> ClusterError:
        return ClusterError(f"allocation {alloc_id} has not joined cluster {name} yet: {seen[0]}")

    return until(step, 2.0, clock, timeout, late)


def shrink(
    name: str, alloc_id: str, deadline: float = 60.0, timeout: float = 300, clock: Clock = REAL
) -> Grown:
    """Release a grown allocation: drained by the head (nothing new lands there), its nodes leave
    once idle or after `deadline` seconds, then it is ended. Its entry once ended."""
    record = records.read(name)
    entry = record.grown_entry(alloc_id)
    if entry is None:
        grown = ", ".join(g.alloc_id for g in record.grown if not g.released) or "none"
        raise ConfigError(f"shrink: {alloc_id} is no grown allocation of cluster {name} (grown: {grown})")
    backend = allocator(record.backend)
    if not entry.hosts or record.state is not ClusterState.READY:  # (no nodes in Ray yet: nothing to drain)
        backend.cancel(alloc_id)
        return records.note_grown(name, alloc_id, leaving="shrink", released=time.time()) or entry
    if not entry.leaving:
        records.note_grown(name, alloc_id, leaving="raystack shrink", deadline=deadline)

    def ended() -> Grown | None:
        now = records.read(name).grown_entry(alloc_id)
        if now is None or not now.released:
            return None
        backend.cancel(alloc_id)  # (its nodes left; what remains of it ends here)
        info = backend.info(alloc_id)
        return now if info is None or info.state.is_terminal() else None

    def late() -> ClusterError:
        return ClusterError(
            f"allocation {alloc_id} did not leave within {timeout:.0f}s; the head drains it still"
        )

    return until(ended, 1.0, clock, timeout + deadline, late)
