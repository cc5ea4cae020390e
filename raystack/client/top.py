"""`raystack top`: one snapshot of a live cluster from Ray's own node stats and the cluster
folder — per node CPU, memory and GPUs, the jobs running with their elapsed time, the queue,
the time left in the allocation and how long it has been idle. No Prometheus needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from raystack.adapters.ray import Dashboard
from raystack.client.access import live_dashboard
from raystack.client.cluster import allocation_place
from raystack.client.reconcile import as_ended, pending_end
from raystack.errors import ClusterError, RayApiError
from raystack.store import cluster as records
from raystack.store.ledger import read_job
from raystack.store.queue import active, waiting
from raystack.waiting import REAL, Clock, until

MIB = 1024 * 1024
QUEUE_SHOWN = 20  # queued jobs named in a snapshot (the count covers the rest)


def _node(stats: dict[str, Any], processes: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One node's figures, from an entry of the dashboard's node summary."""
    raylet = stats.get("raylet") or {}
    mem = stats.get("mem") or [0, 0, 0, 0]  # psutil: total, available, percent, used
    cpus = stats.get("cpus") or [0, 0]  # logical, physical
    gpus = [
        {
            "index": g.get("index"),
            "name": g.get("name"),
            "util": g.get("utilizationGpu"),
            "mem_used_mib": g.get("memoryUsed"),
            "mem_total_mib": g.get("memoryTotal"),
        }
        for g in stats.get("gpus") or []
    ]
    node = {
        "host": stats.get("hostname") or raylet.get("nodeManagerHostname"),
        "ip": stats.get("ip") or raylet.get("nodeManagerAddress"),
        "node_id": raylet.get("nodeId"),
        "head": bool(raylet.get("isHeadNode")),
        "state": raylet.get("state"),
        "cpu_percent": stats.get("cpu"),
        "cpus": cpus[0] if cpus else None,
        "mem_used": int(mem[0] - mem[1]) if len(mem) >= 2 else None,
        "mem_total": int(mem[0]) if mem else None,
        "gpus": gpus,
        "ray_cpu": None,
    }
    if processes is not None:
        # cores used by Ray's workers and agents on this node (psutil's per-process %, summed)
        node["ray_cpu"] = round(sum(float(p.get("cpuPercent") or 0) for p in processes) / 100, 2)
    return node


def nodes(dashboard: Dashboard, processes: bool = True) -> list[dict[str, Any]]:
    """Every alive node's figures, head first, then by address."""
    summary = [s for s in dashboard.node_stats() if (s.get("raylet") or {}).get("state") == "ALIVE"]
    procs: list[list[dict[str, Any]] | None] = [None] * len(summary)
    if processes and summary:

        def fetch(entry: dict[str, Any]) -> list[dict[str, Any]] | None:
            try:
                return dashboard.node_processes(str(entry["raylet"]["nodeId"]))
            except (RayApiError, KeyError):
                return None

        with ThreadPoolExecutor(max_workers=min(8, len(summary))) as pool:
            procs = list(pool.map(fetch, summary))
    found = [_node(s, p) for s, p in zip(summary, procs, strict=True)]
    return sorted(found, key=lambda n: (not n["head"], str(n["ip"])))


def jobs_view(name: str, now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(jobs in flight with their elapsed time, the first queued jobs, how many are queued)."""
    running = []
    for job_id in active(name):
        try:
            job = read_job(name, job_id)
        except ClusterError:
            continue
        running.append(
            {
                "id": job.id,
                "name": job.name,
                "state": job.state.value,
                "elapsed_s": round(now - job.started, 1) if job.started else None,
            }
        )
    entries = waiting(name)
    queued = []
    for entry in entries[:QUEUE_SHOWN]:
        try:
            job = read_job(name, entry.job_id)
            queued.append({"id": job.id, "name": job.name, "state": job.state.value})
        except ClusterError:
            continue
    return running, queued, len(entries)


def watch(
    name: str, interval: float, show: Callable[[dict[str, Any]], None], clock: Clock = REAL
) -> dict[str, Any]:
    """A new snapshot every `interval` seconds, each handed to `show`, until the cluster has
    ended; the last one."""

    def look() -> dict[str, Any] | None:
        view = snapshot(name)
        show(view)
        return view if view["ended"] else None

    clock.sleep(interval)  # (the caller shows the first view)
    return until(look, interval, clock)


def snapshot(name: str, processes: bool = True) -> dict[str, Any]:
    """Everything `raystack top` shows, as one dict (`top --once --json` prints it)."""
    raw = records.read(name)
    record = as_ended(raw, pending_end(raw))  # (an end its head could not record shows as ended)
    ended = record.state.is_terminal()
    now = time.time()
    view: dict[str, Any] = {
        "cluster": name,
        "time": round(now, 2),
        "state": record.state.value,
        "ended": ended,
        "message": record.message,
        "allocation_id": record.allocation_id,
        "where": allocation_place(record) if record.allocation_id else "-",
        "time_left_s": (
            max(0, int(record.walltime_end - now)) if record.walltime_end and not ended else None
        ),
        "nodes_expected": record.nodes_expected,
        "idle_s": round(now - record.idle_since, 1) if record.idle_since else None,
        "idle_timeout_s": record.idle_timeout,
        "nodes": [],
        "ray_error": None,
    }
    view["running"], view["queue"], view["queued"] = jobs_view(name, now)
    if record.dashboard_url and not record.state.is_terminal():
        try:
            view["nodes"] = nodes(live_dashboard(record), processes)
        except (RayApiError, ClusterError) as exc:  # (ClusterError: no token sent to a stale address)
            view["ray_error"] = str(exc)
    return view
