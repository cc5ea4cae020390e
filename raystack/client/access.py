"""The one way the login side reaches a cluster's dashboard with its token.

A record names the dashboard's address; once its allocation has ended, another process (another
user's) may listen there. So the token goes only to an address whose allocation SLURM confirms
is RUNNING now (on a TLS cluster the certificate is checked too, by Dashboard.of).
"""

from __future__ import annotations

from raystack.adapters.allocator import AllocInfo, AllocState, allocator
from raystack.adapters.ray import Dashboard
from raystack.errors import ClusterError
from raystack.store.cluster import ClusterRecord
from raystack.waiting import REAL, Backoff, Clock, retry


def live_dashboard(record: ClusterRecord, info: AllocInfo | None = None, clock: Clock = REAL) -> Dashboard:
    """The dashboard of a cluster whose allocation runs now; ClusterError (nothing sent) else."""
    if not record.dashboard_url or record.state.is_terminal() or not record.allocation_id:
        raise ClusterError(f"cluster {record.name} has no dashboard ({record.state.value})")
    backend, alloc_id = allocator(record.backend), record.allocation_id

    def ask(attempt: int) -> AllocInfo | None:
        if attempt:
            backend.forget(alloc_id)
        return backend.info(alloc_id)

    # (a slurmctld that is busy for a moment: ask again, 0.5, 1 and 2 s later)
    info = info or retry(ask, 4, Backoff(first=0.5, cap=2.0, jitter=0.0).next, clock)
    if info is None:
        raise ClusterError(
            f"SLURM did not say whether allocation {record.allocation_id} of cluster {record.name} still "
            "runs: nothing was sent to its dashboard (try again)"
        )
    if info.state is not AllocState.RUNNING:
        raise ClusterError(
            f"allocation {record.allocation_id} of cluster {record.name} is {info.state_text} in SLURM: "
            f"its dashboard address {record.dashboard_url} is stale; nothing was sent to it"
        )
    return Dashboard.of(record.name, record.dashboard_url)
