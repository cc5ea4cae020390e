"""Idle autostop: the head ends a cluster that has had nothing to do for `idle_timeout` seconds.

Idle means, at every check (with every usage sample): the queue is empty, no raystack job is
in flight, and Ray lists no job PENDING or RUNNING — neither a `ray job submit` job nor a driver
attached with `ray.init(address=...)`. Anything else (or a check that fails) counts as busy, so
the cluster never goes down under a job. The idle clock starts at READY and restarts at every
busy check; `idle_since` in the record shows it (`raystack status`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from raystack.adapters.ray import Dashboard, ray_state
from raystack.allocation.node.usage import sample_every
from raystack.durations import duration_text
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.cluster import ClusterState, EndKind
from raystack.store.files import locked
from raystack.store.queue import active, waiting

log = logging.getLogger("raystack.node")
# Seconds between checks: the usage samples' period (they carry the result).
LIVE_RAY_STATES = ("PENDING", "RUNNING")


class IdleWatch:
    """Tracks how long the cluster has been idle; `__call__` says when it should end."""

    def __init__(
        self,
        cluster: str,
        timeout: float | None,
        dashboard: Callable[[], Dashboard | None],
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cluster, self.timeout, self.clock = cluster, timeout, clock
        self.every = sample_every() if every is None else every
        self.dashboard = dashboard
        self.checked = -1e18
        self.idle_from: float | None = clock()  # (monotonic) READY starts the clock
        self.other_jobs = 0  # Ray jobs not raystack's live at the last check (usage samples)
        self.busy_with = ""
        records.update(cluster, idle_since=time.time())

    def busy(self) -> str:
        """What keeps the cluster busy now ('' when idle). Other Ray jobs are counted only when
        the Jobs API is asked (nothing of raystack's queued or running): 0 otherwise, never a
        count left from an earlier check (the usage report's "other jobs" time)."""
        self.other_jobs = 0
        queued = waiting(self.cluster)
        if queued:
            return f"{len(queued)} queued"
        running = active(self.cluster)
        if running:
            return f"job {running[0]}"
        grown = [g.alloc_id for g in records.read(self.cluster).grown if not g.released]
        if grown:  # (released first, when idle: elastic/autoscale.py; then the cluster's own clock)
            return f"grown allocation {grown[0]}"
        dashboard = self.dashboard()
        if dashboard is None:
            return "no dashboard yet"
        try:
            jobs: list[Any] = dashboard.list_jobs()
        except Exception as exc:  # unknown counts as busy: never stop on a failed check
            return f"the Jobs API did not answer ({type(exc).__name__})"
        live = [j for j in jobs if ray_state(j) in LIVE_RAY_STATES]
        self.other_jobs = sum(1 for j in live if "raystack_job" not in (j.metadata or {}))
        if live:
            j = live[0]
            kind = str(getattr(j.type, "value", j.type) or "").lower()
            return f"Ray {kind or 'job'} {j.submission_id or j.job_id}"
        return ""

    def __call__(self) -> str | None:
        """Checks (rate-limited); returns why the cluster should end now, else None."""
        if self.clock() - self.checked < self.every:
            return None
        self.checked = self.clock()
        why = self.busy()
        if why:
            if self.idle_from is not None:
                log.info("busy (%s)", why)
                records.update(self.cluster, idle_since=None)
            self.idle_from, self.busy_with = None, why
            return None
        if self.idle_from is None:
            self.idle_from = self.clock()
            log.info("idle (after %s)", self.busy_with)
            records.update(self.cluster, idle_since=time.time())
        idle = self.clock() - self.idle_from
        if self.timeout is None or idle < self.timeout:
            return None
        return self.claim(idle)

    def claim(self, idle: float) -> str | None:
        """Under the cluster lock (which `submit` takes to queue a job): still nothing queued or
        in flight? Then the cluster is STOPPING, and new submissions are refused."""
        text = f"idle for {duration_text(idle)} (idle timeout {duration_text(self.timeout or 0)})"
        p = paths.cluster(self.cluster)
        with locked(p):
            if waiting(self.cluster) or active(self.cluster):
                return None
            record = records.read(self.cluster)
            if record.ending is not None or record.state is not ClusterState.READY:
                return None  # a walltime warning or `down` came first
            records.apply_changes(
                record,
                {
                    "state": ClusterState.STOPPING,
                    "ending": EndKind.IDLE,
                    "chain_ended": f"{text}: autostop",
                    "message": f"autostop: {text}",
                },
            )
            records.write(record)
        log.warning("autostop: %s; ending the cluster", text)
        return text
