"""What becomes of an attempt that did not succeed: retried (its spec's `retries`), or put back
in the queue because its nodes left the cluster (`raystack shrink`, a grown allocation's walltime,
scancel or preemption: allocation/elastic/leaving.py)."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from raystack.adapters.ray import Dashboard
from raystack.allocation.elastic.leaving import lost_with
from raystack.errors import RayApiError
from raystack.launch import pool
from raystack.plan.topology import plural
from raystack.store import cluster as records
from raystack.store import paths, raylogs, recovery
from raystack.store.ledger import JobRecord, JobState, update_job

log = logging.getLogger("raystack.runner")
RETRY_WINDOW = 300.0  # seconds after its start within which a failed attempt is retried
MOST_NODE_LOSSES = 3  # times a job is put back in the queue after nodes died under it
# Where Ray says a job's actor or task died with its node: "... its node has died. Node Id: 4e6d..."
NODE_ID = re.compile(r"node id:?\s*([0-9a-f]{56})", re.IGNORECASE)
DYING = 60.0  # seconds the queue waits for Ray to mark such a node dead before it starts more


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


def lost(
    name: str, api: Dashboard, record: JobRecord, ray_job: str | None, dying: dict[str, float] | None = None
) -> JobRecord:
    """A job that FAILED because a node it had work on died under it (hardware, its node program
    or its Ray killed), or a grown allocation it had work on ended under it before the head could
    drain it (SLURM ends every process of a cancelled or preempted allocation at once): it is
    evicted, and put back in the queue like a job on nodes that `shrink` drains, at most
    MOST_NODE_LOSSES times (a job whose own memory use kills its nodes FAILS then)."""
    if not ray_job:
        return record
    cluster = records.read(name)
    groups = (pool.PREFIX + record.attempts[-1].id,) if record.attempts else ()
    log_file = paths.cluster(name).job_log(record.id, max(1, len(record.attempts)))
    # (Ray's own words name the node where its State API may have lost the work)
    named = set(NODE_ID.findall(raylogs.log_end(log_file, 64 << 10)))
    try:
        found = lost_with(cluster, api, ray_job, groups=groups, named=named)
    except RayApiError as exc:
        log.warning("%s failed; whether its nodes left the cluster is unknown: %s", record.id, exc)
        return record
    if found is None:
        return record
    losses = sum(" under it" in str(h.get("message")) for h in record.history if h["state"] == "INTERRUPTED")
    if losses >= MOST_NODE_LOSSES:
        log.info("%s failed with its nodes (%s), %d times: it fails", record.id, found.why, losses + 1)
        return record
    if found.left and found.grown and not found.grown.leaving:  # (the head's Leaving releases it)
        records.note_grown(name, found.grown.alloc_id, leaving=found.how)
    log.info("%s failed with its nodes: %s", record.id, found.why)
    if found.node_id and dying is not None:  # (no job starts while Ray may still place work there)
        dying[found.node_id] = time.time() + DYING
    return update_job(name, record.id, evicted=found.why)


def still_dying(api: Dashboard, dying: dict[str, float]) -> bool:
    """Whether a node that died under a job is still listed alive by Ray (for DYING seconds at
    most): nothing starts meanwhile, or Ray would place the job's work on it again."""
    if not dying:
        return False
    try:
        alive = {n.node_id for n in api.alive_nodes()}
    except RayApiError:
        return True
    for node_id in [n for n, until in dying.items() if n not in alive or time.time() > until]:
        del dying[node_id]
    return bool(dying)
