"""Reconciliation: bring a cluster record that looks alive in line with what SLURM says.

The head records the end itself when SLURM signals it; this covers the cases where it could not
(SIGKILL, node failure, cancelled while pending). It is the one place where a client command
writes records it reads, and it only ever writes an ending.
"""

from __future__ import annotations

from raystack.adapters import slurm
from raystack.store import cluster as records
from raystack.store import paths
from raystack.store.cluster import ClusterRecord, ClusterState
from raystack.store.queue import interrupt_in_flight


def reconcile(record: ClusterRecord, info: slurm.JobInfo | None = None) -> ClusterRecord:
    """Bring a live-looking record in line with SLURM: a finished allocation ends the cluster.

    The head records STOPPED itself when SLURM signals it; this covers the cases where it could
    not (SIGKILL, node failure, cancelled while pending). `info` saves a query when known.
    """
    if record.state.is_terminal() or not record.slurm_job_id:
        return record
    info = info or slurm.job_info(record.slurm_job_id)
    if info is None or not info.state.is_terminal():
        return record
    ended_ok = record.state in (ClusterState.READY, ClusterState.STOPPING)
    state = ClusterState.STOPPED if ended_ok else ClusterState.FAILED
    message = (
        f"allocation {record.slurm_job_id} ended ({info.state.value}"
        f"{', ' + info.reason if info.reason and info.reason != 'None' else ''}); "
        f"logs: {paths.cluster(record.name).logs}"
    )
    record = records.update(record.name, state=state, message=message)
    interrupt_in_flight(record.name, f"SLURM job {record.slurm_job_id} {info.state.value}")
    return record
