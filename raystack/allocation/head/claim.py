"""The head's claim on its cluster: node 0 takes the cluster's record for its allocation (refusing
when another live allocation of the same name holds it), with the fields the head writes at its
start."""

from __future__ import annotations

import importlib.metadata
import time

from raystack.adapters.allocator import allocator
from raystack.allocation.node.context import (
    NodeContext,
)
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.cluster import ClusterState
from raystack.store.files import locked


class Displaced(RaystackError):
    """Another live allocation runs this cluster: this one must not touch its record."""


def claim(ctx: NodeContext) -> bool:
    """Make this allocation the cluster's current one, unless another live allocation is.

    Two allocations of one name (a hand-submitted twin, a restarted `up`) would run two runners
    on one queue; the one that finds a live other holder leaves instead. Returns whether this
    allocation continues a chain, or runs again after SLURM requeued it (the jobs in flight of
    the last allocation, or of its earlier run, then resume).
    """
    p = paths.cluster(ctx.cluster)
    with locked(p):
        record = records.read(ctx.cluster) if records.exists(ctx.cluster) else None
        other = record.allocation_id if record else None
        if other and other != ctx.alloc_id:
            holder = allocator(record.backend) if record else ctx.allocator
            info = holder.info(other)
            if info is None or not info.state.is_terminal():
                state = info.state_text if info else "state unknown: SLURM did not answer"
                raise Displaced(
                    f"cluster {ctx.cluster} is already run by {holder.place(other)} ({state}); "
                    f"allocation {ctx.alloc_id} leaves it alone and exits"
                )
        record = record or records.ClusterRecord(name=ctx.cluster)
        follow_on = record.next_allocation_id == ctx.alloc_id or (
            other == ctx.alloc_id and (record.chain_index > 1 or ctx.restart > record.allocation_restart)
        )
        if record.next_allocation_id == ctx.alloc_id:  # the last head could not hand over (SIGKILL)
            records.apply_changes(record, {"chain_index": record.chain_index + 1, "next_allocation_id": None})
        held = {"allocation_id": ctx.alloc_id, "allocation_restart": ctx.restart, "backend": ctx.backend}
        records.apply_changes(record, {**held, "ending": None})
        records.note_allocation(record, ctx.alloc_id, started=time.time(), nodes=ctx.num_nodes)
        records.write(record)
        return follow_on


def head_record_fields(ctx: NodeContext, ports: dict[str, int]) -> dict[str, object]:
    info = ctx.allocator.info(ctx.alloc_id)
    return dict(
        state=ClusterState.STARTING,
        message=f"Ray head starting on {ctx.host}; waiting for nodes",
        allocation_id=ctx.alloc_id,
        head_host=ctx.host,
        head_ip=ctx.ip,
        ports=ports,
        gcs_address=f"{ctx.ip}:{ports['gcs']}",
        dashboard_url=f"{'https' if ctx.tls else 'http'}://{ctx.ip}:{ports['dashboard']}",
        tls=ctx.tls is not None,
        nodes=ctx.allocator.hosts(ctx.alloc_id, ctx.nodelist or ctx.host),
        nodes_expected=ctx.num_nodes,
        nodes_joined=0,
        gpus_per_node=ctx.gpus,
        cpus_per_node=ctx.cpus,
        ray_version=importlib.metadata.version("ray"),
        walltime_end=info.end_time if info and info.end_time else None,
        idle_timeout=ctx.idle_timeout,
        idle_since=None,
        prometheus=f"http://127.0.0.1:{ports['prometheus']}" if "prometheus" in ports else None,
    )
