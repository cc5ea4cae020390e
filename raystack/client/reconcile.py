"""Reconciliation: bring a cluster record that looks alive in line with what SLURM says.

The head records the end itself when SLURM signals it; this covers the cases where it could not
(SIGKILL, node failure, cancelled while pending). It is the one place where a client command
writes records it reads, and it only ever writes an ending — and only when SLURM says the
allocation ended: a failing squeue is never an answer, and "gone" (slurmctld no longer knows
the job and accounting has no row) must be said twice, a second apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from raystack.adapters import slurm
from raystack.adapters.slurm import JobInfo, SlurmState
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.queue import settle_orphans

CONFIRM_GONE_AFTER = 1.0  # seconds between the two answers that make a job GONE


def allocation_ended(
    job_id: str, info: JobInfo | None = None, sleep: Callable[[float], None] = time.sleep
) -> JobInfo | None:
    """SLURM's final word on an allocation, or None while it lives or SLURM cannot be asked."""
    info = info or slurm.job_info(job_id)
    if info is None or not info.state.is_terminal():
        return None
    if info.state is SlurmState.GONE:
        sleep(CONFIRM_GONE_AFTER)
        slurm.forget(job_id)
        again = slurm.job_info(job_id)
        if again is None or not again.state.is_terminal():
            return None
        info = again
    return info


def reconcile(record: ClusterRecord, info: JobInfo | None = None) -> ClusterRecord:
    """A live-looking record whose allocation SLURM says has ended is ended too (and its jobs in
    flight settled). `info` saves a query when the caller has one."""
    if record.state.is_terminal() or not record.slurm_job_id:
        return record
    ended = allocation_ended(record.slurm_job_id, info)
    if ended is None:
        return record
    ended_ok = record.state in (ClusterState.READY, ClusterState.STOPPING)
    state = ClusterState.STOPPED if ended_ok else ClusterState.FAILED
    reason = f", {ended.reason}" if ended.reason and ended.reason != "None" else ""
    message = (
        f"allocation {record.slurm_job_id} ended ({ended.state.value}{reason}); "
        f"logs: {paths.cluster(record.name).logs}"
    )
    with_job = records.read(record.name)
    if with_job.slurm_job_id != record.slurm_job_id or with_job.state.is_terminal():
        return with_job  # someone settled it, or a new allocation took over, meanwhile
    settle_orphans(record.name, None, f"SLURM job {record.slurm_job_id} {ended.state.value}")
    return records.update(record.name, state=state, message=message)
