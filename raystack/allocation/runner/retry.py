"""What becomes of an attempt that did not succeed: retried (its spec's `retries`), or put back
in the queue because its nodes left the cluster (`raystack shrink`, a grown allocation's walltime,
scancel or preemption: allocation/elastic/leaving.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

from raystack.adapters.ray import Dashboard
from raystack.allocation.elastic.leaving import lost_with
from raystack.errors import RayApiError
from raystack.plan.topology import plural
from raystack.store import cluster as records
from raystack.store import recovery
from raystack.store.ledger import JobRecord, JobState, update_job

log = logging.getLogger("raystack.runner")
RETRY_WINDOW = 300.0  # seconds after its start within which a failed attempt is retried


def may_retry(record: JobRecord, state: JobState, info: Any) -> bool:
    """A FAILED attempt is retried while retries are left, if it failed within the retry
    window of its start (a flaky start, not a crash hours in); never after a stop, a
    timeout, or a fault the watchdog found (infeasible, hung)."""
    req = record.request
    if state is not JobState.FAILED or record.stop_requested or record.fault:
        return False
    if len(record.attempts) > req.retries:
        return False
    window = RETRY_WINDOW if req.retry_window is None else req.retry_window
    start = (info.start_time or 0) / 1000 or record.attempts[-1].at
    end = (info.end_time or 0) / 1000 or time.time()
    if window and end - start > window:
        log.info(
            "%s failed %.0fs after its start, beyond its retry window: not retried",
            record.id,
            end - start,
        )
        return False
    return True


def evicted_outcome(name: str, record: JobRecord) -> tuple[JobState, str] | None:
    """A job stopped because its nodes left the cluster: back at the head of the queue to start
    again on the nodes that remain (None: requeued), or FAILED when they can never hold it."""
    want = (record.request.needs or {}).get("nodes")
    held = records.read(name).nodes_held
    why = f"stopped: {record.evicted}"
    if want and want > held:
        return JobState.FAILED, f"{why}; it needs {plural(want, 'node')} and the cluster holds {held} now"
    recovery.requeue(name, record.id, f"{why}; it starts again on the nodes that remain")
    log.info("%s INTERRUPTED (%s): back at the head of the queue", record.id, record.evicted)
    return None


def lost(name: str, api: Dashboard, record: JobRecord, ray_job: str | None) -> JobRecord:
    """A job that FAILED because a grown allocation it had work on ended under it, before the head
    could drain it (SLURM ends every process of a cancelled or preempted allocation at once): it
    is evicted too, and put back in the queue like a job on nodes that `shrink` drains."""
    cluster = records.read(name)
    if not cluster.grown or not ray_job:
        return record
    try:
        found = lost_with(cluster, api, ray_job)
    except RayApiError as exc:
        log.warning("%s failed; whether its nodes left the cluster is unknown: %s", record.id, exc)
        return record
    if found is None:
        return record
    if not found.grown.leaving:  # (its nodes are no longer counted; the head's Leaving releases it)
        records.note_grown(name, found.grown.alloc_id, leaving=found.how)
    log.info("%s failed with its nodes: %s", record.id, found.why)
    return update_job(name, record.id, evicted=found.why)
