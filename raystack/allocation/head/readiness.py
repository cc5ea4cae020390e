"""The head's readiness: every node joined with its GPUs and CPUs and the Jobs API answering,
within `join_timeout` of the last node that joined; and what to say when it is not."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from raystack.adapters.ray import Dashboard, NodeSummary
from raystack.allocation.node.context import POLL, NodeContext, node_log
from raystack.allocation.node.rayproc import RayProcess, why_ray_ended
from raystack.errors import RaystackError
from raystack.store import cluster as records
from raystack.store import node_entries
from raystack.waiting import REAL, Clock, until

log = logging.getLogger("raystack.node")


def head_exited(code: int | None, log_path: Path) -> str:
    """The end of a head whose `ray start` exited: its code, which daemon died and how (when
    Ray said), and where to read more."""
    died = why_ray_ended(log_path)
    return f"the Ray head exited with code {code}; see {log_path}" + (f": {died}" if died else "")


def missing_nodes(ctx: NodeContext, alive: list[NodeSummary]) -> list[str]:
    """Host names expected in the allocation whose address is not among Ray's alive nodes."""
    if ctx.num_nodes == 1:  # (a local cluster's 127.0.0.1 is reported by Ray as the host's address)
        return [] if alive else [ctx.host]
    entries = node_entries.read_node_entries(ctx.cluster)
    alive_ips = {n.ip for n in alive}
    record = records.read(ctx.cluster)
    return [h for h in record.nodes if entries.get(h, {}).get("ip") not in alive_ips]


def wait_ready(
    ctx: NodeContext,
    dashboard: Dashboard,
    ray: RayProcess,
    beat: Callable[[], object] = lambda: None,
    clock: Clock = REAL,
) -> None:
    """Until all nodes are alive with the expected GPUs and CPUs and the Jobs API answers."""
    want_cpus = sum(ctx.cpus_per_node) if ctx.cpus_per_node else ctx.cpus * ctx.num_nodes
    want_gpus = ctx.gpus * ctx.num_nodes
    # NOTE: the deadline moves with progress: a large start on a slow GCS may take longer than
    # join_timeout in all, but it fails only after join_timeout without a node joining.
    deadline = clock.now() + ctx.join_timeout
    nodes: list[NodeSummary] = []
    joined, why = -1, "the State API has not answered yet"

    def ready() -> bool | None:
        nonlocal nodes, joined, why, deadline
        beat()
        if not ray.alive():
            raise RaystackError(head_exited(ray.proc.returncode, node_log(ctx, ctx.host)))
        try:
            nodes = dashboard.alive_nodes()
            gpus = sum(n.resources.get("GPU", 0) for n in nodes)
            cpus = sum(n.resources.get("CPU", 0) for n in nodes)
            if len(nodes) != joined:
                if len(nodes) > joined >= 0:
                    deadline = clock.now() + ctx.join_timeout
                joined = len(nodes)
                log.info("%d/%d nodes joined (%g GPUs, %g CPUs)", joined, ctx.num_nodes, gpus, cpus)
                records.update(
                    ctx.cluster, nodes_joined=joined, message=f"{joined}/{ctx.num_nodes} nodes joined"
                )
            if joined >= ctx.num_nodes and gpus >= want_gpus and cpus >= want_cpus:
                problem = dashboard.probe()
                if problem is None:
                    memory = min((int(n.resources.get("memory", 0)) for n in nodes), default=0)
                    records.update(ctx.cluster, memory_per_node=memory)  # (what a driver may ask)
                    return True
                why = problem
            else:
                why = f"{joined}/{ctx.num_nodes} nodes, {gpus:g}/{want_gpus} GPUs, {cpus:g}/{want_cpus} CPUs"
        except RaystackError as exc:
            why = str(exc)
        if clock.now() > deadline:
            raise RaystackError(_not_ready_message(ctx, nodes, why))
        return None

    until(ready, POLL, clock)


def _not_ready_message(ctx: NodeContext, nodes: list[NodeSummary], why: str) -> str:
    missing = missing_nodes(ctx, nodes)
    if missing:
        return (
            f"node {missing[0]} did not join within {ctx.join_timeout:.0f}s (while no other node joined)"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; "
            f"its log: {node_log(ctx, missing[0])}"
        )
    return f"cluster not ready within {ctx.join_timeout:.0f}s: {why}; see {node_log(ctx, ctx.host)}"
