"""What becomes of an attempt that did not succeed: retried (its spec's `retries`), or put back
in the queue because its nodes left the cluster (`raystack shrink`: allocation/leaving.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

from raystack.plan.topology import plural
from raystack.store import cluster as records
from raystack.store import queue as store
from raystack.store.ledger import JobRecord, JobState

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
    store.requeue(name, record.id, f"{why}; it starts again on the nodes that remain")
    log.info("%s INTERRUPTED (%s): back at the head of the queue", record.id, record.evicted)
    return None
