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

from raystack.adapters.allocator import Allocator, allocator
from raystack.adapters.slurm import JobInfo, SlurmState
from raystack.store import cluster as records
from raystack.store.cluster import ClusterRecord, ClusterState, EndKind
from raystack.walltime import Ending, classify, end_allocation

CONFIRM_GONE_AFTER = 1.0  # seconds between the two answers that make a job GONE


def allocation_ended(
    backend: Allocator,
    alloc_id: str,
    info: JobInfo | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> JobInfo | None:
    """SLURM's final word on an allocation, or None while it lives or SLURM cannot be asked."""
    info = info or backend.info(alloc_id)
    if info is None or not info.state.is_terminal():
        return None
    if info.state is SlurmState.GONE:
        sleep(CONFIRM_GONE_AFTER)
        backend.forget(alloc_id)
        again = backend.info(alloc_id)
        if again is None or not again.state.is_terminal():
            return None
        info = again
    return info


def reconcile(record: ClusterRecord, info: JobInfo | None = None) -> ClusterRecord:
    """A live-looking record whose allocation SLURM says has ended is ended too (and its jobs in
    flight settled). `info` saves a query when the caller has one."""
    if record.state.is_terminal() or not record.allocation_id:
        return record
    ended = allocation_ended(allocator(record.backend), record.allocation_id, info)
    if ended is None:
        return record
    current = records.read(record.name)
    if current.allocation_id != record.allocation_id or current.state.is_terminal():
        return current  # someone settled it, or a new allocation took over, meanwhile
    ran = current.state in (ClusterState.READY, ClusterState.STOPPING)
    if ran or current.state is ClusterState.STARTING:
        # The head could not record the end itself (SIGKILL, a node failure): do it for it.
        end = classify(current, str(record.allocation_id), info=ended)
    else:  # it never started: cancelled or refused while pending
        reason = f", {ended.reason}" if ended.reason and ended.reason != "None" else ""
        end = Ending(EndKind.FAILED, f"{ended.state.value}{reason} before it started", False, False)
    state = ClusterState.STOPPED if ran and end.kind is not EndKind.FAILED else ClusterState.FAILED
    return end_allocation(record.name, str(record.allocation_id), end, state)
